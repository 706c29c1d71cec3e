"""Scale: a dry-run daemon (or several shard processes) with thousands of apps, as a new user runs it.

For each configuration (N apps, S shard processes; `--config 1000x1,10000x1,50000x5`):
1. Make a repository of N synthetic specs, start S `flink-reconciler run` processes (dry run, git-notes
   statuses, poll 2 s, drift 60 s; with S > 1 each is `shards: S`, `shard: i`, its own state dir).
2. First pass (the slowest process's startup pass) and start -> every startup status on the origin.
3. A stream of one-app pushes (one every `--push-every` s for `--stream-seconds`, long enough to span a
   drift pass whose N notes are written meanwhile): push -> that app's status line on the origin, p50/p99.
4. One commit that changes 100 apps: push -> all 100 status lines on the origin.
5. Idle: CPU (incl. the git processes, % of one core, summed over the processes) and RSS (largest
   process) over `--idle-seconds` (one drift interval by default, so one full pass is in the window).

`50000x5@0` in `--config`: only shard 0 of 5 is started, alone on the machine (what one replica with a
core of its own sees; the pushes and statuses are its apps only), next to `50000x5` where all five share
this machine's cores.

`--takeover 50000x5`: `shard: auto` instead, 5 replicas against the stand-in API server (tests/kubernetes/
standin.py, in this process; dry run, specs the kubernetes runtime accepts): once every startup status is
on the origin and each replica holds one shard, SIGKILL the holder of shard 0, push a commit changing 50
of its apps, and print kill -> its Lease held by another replica -> all 50 statuses on the origin.

Run: .venv/bin/python bench/scale_bench.py [--config 1000x1,10000x1] [--idle-seconds 60] [--takeover 50000x5]
The daemons run with PYTHONMALLOC=malloc and MALLOC_ARENA_MAX=2 and the package's bytecode compiled (into
reconciler/**/__pycache__, ignored by Git), as in the image (--pymalloc: Python's own allocator).
Prints one JSON document, then a Markdown table. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.daemon_bench import CLK_TCK, proc_sample, wait
from reconciler.service.sharding import shard_of
from tests.e2e.test_daemon_e2e import DaemonProc
from tests.gitutil import GIT_ENV, Repo

NOTES_REF = "refs/notes/flink-reconciler"
POLL = 2.0
DRIFT = 60.0

SPEC = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: app-{i:05d}
spec:
  taskManager:
    slots: 2
  flinkConfiguration:
    execution.checkpointing.interval: 10 s
  job:
    jarURI: https://repo.example.com/jobs/app-{v}.jar
    entryClass: com.example.Job{i}
    args: ["--id", "{i}"]
    parallelism: {p}
    upgradeMode: savepoint
"""


# What the kubernetes runtime accepts (durable state, HA, a jar in the image): `shard: auto` runs there,
# and a spec it refuses would be an error, not an app (the takeover would measure errors).
K8S_SPEC = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: app-{i:05d}
  namespace: flink
spec:
  image: flink:2.3
  taskManager:
    slots: 2
  highAvailability:
    enabled: true
    storageDir: s3://flink/ha/app-{i:05d}
  flinkConfiguration:
    execution.checkpointing.interval: 10 s
    execution.checkpointing.dir: s3://flink/checkpoints/app-{i:05d}
    execution.checkpointing.savepoint-dir: s3://flink/savepoints/app-{i:05d}
  job:
    jarURI: local:///opt/flink/usrlib/app-{v}.jar
    entryClass: com.example.Job{i}
    args: ["--id", "{i}"]
    parallelism: {p}
    upgradeMode: savepoint
"""


def write_app(repo: Repo, i: int, v: int = 1, *, template: str = SPEC) -> None:
    repo.write(f"apps/{i // 1000:02d}/app-{i:05d}.yaml", template.format(i=i, v=v, p=1 + i % 2))


def origin_note(repo: Repo, sha: str) -> str:
    """The notes on `sha` in the origin itself, the unsharded ref's and every shard's (no fetch: the bench
    looks at the bare repository)."""
    out = []
    for ref in notes_refs(repo).splitlines():
        proc = subprocess.run(["git", "--git-dir", str(repo.origin), "notes", "--ref", ref.split()[1], "show", sha],
                              capture_output=True, text=True, check=False, env={**os.environ, **GIT_ENV})
        out.append(proc.stdout if proc.returncode == 0 else "")
    return "".join(out)


def notes_refs(repo: Repo) -> str:
    """`<sha> <ref>` per notes ref the daemons write (a shard its own: refs/notes/flink-reconciler-shard-<i>)."""
    return subprocess.run(["git", "--git-dir", str(repo.origin), "for-each-ref", "--format=%(objectname) %(refname)",
                           NOTES_REF, NOTES_REF + "-shard-*"], capture_output=True, text=True, check=True,
                          env={**os.environ, **GIT_ENV}).stdout


def status_apps(note: str) -> set[str]:
    return {line.split(": ", 1)[0].removeprefix("flink-reconciler/") for line in note.splitlines()
            if line.startswith("flink-reconciler/")}


class OriginStatuses:
    """The apps with a status line on a commit, on the origin; a note is read again only when one of the
    origin's notes refs moved. (Reading a 50,000-line note at every poll took a tenth of a core from the
    daemons being measured.)"""

    def __init__(self, repo: Repo) -> None:
        self._repo = repo
        self._tip: str | None = None
        self._apps: dict[str, set[str]] = {}

    def on(self, sha: str) -> set[str]:
        tip = notes_refs(self._repo) or None
        if tip != self._tip:
            self._tip, self._apps = tip, {}
        if sha not in self._apps:
            self._apps[sha] = status_apps(origin_note(self._repo, sha))
        return self._apps[sha]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return round(s[min(len(s) - 1, round(q * (len(s) - 1)))], 3)


def scale(root: Path, n: int, shards: int, *, push_every: float, stream_seconds: float,
          idle_seconds: float, only: int | None = None) -> dict[str, Any]:
    repo = Repo(root)
    for i in range(n):
        write_app(repo, i)
    head = repo.commit(f"{n} apps")
    statuses = OriginStatuses(repo)
    # the apps whose statuses are waited for: every app, or those of the one shard started
    ids = [i for i in range(n) if only is None or shard_of(f"app-{i:05d}", shards) == only]
    t0 = time.time()
    procs = []
    for s in range(shards) if only is None else [only]:
        extra: dict[str, object] = {"shards": shards, "shard": s} if shards > 1 else {}
        procs.append(DaemonProc.start(root / f"daemon-{s}.log", repo_url=repo.origin, state_dir=root / f"state-{s}",
                                      dry_run=True, poll_interval=POLL, drift_interval=DRIFT, status_sink="notes",
                                      **extra))
    out: dict[str, Any] = {"apps": n, "shards": shards, "poll_s": POLL, "drift_s": DRIFT, "only_shard": only}
    try:
        # The statuses come after the passes: waited for first, so that polling five daemons' metrics does
        # not delay seeing them.
        wait(lambda: len(statuses.on(head)) >= len(ids), 1800, f"{len(ids)} statuses on the origin", interval=0.2)
        out["startup_statuses_on_origin_s"] = round(time.time() - t0, 1)
        for d in procs:
            wait(lambda d=d: d.passes("startup") >= 1, 1800, "the startup pass", interval=0.5)
        out["first_pass_s"] = round(max(d.metric("flink_reconciler_sync_duration_seconds_sum", trigger="startup")
                                        for d in procs), 2)
        # A stream of one-app pushes, spanning a drift pass.
        lat: list[float] = []
        t_end = time.monotonic() + stream_seconds
        k = 0
        while time.monotonic() < t_end:
            t_slot = time.monotonic()
            app = ids[(k * 7919) % len(ids)]
            k += 1
            write_app(repo, app, v=k + 1)
            sha = repo.commit(f"app {app}")
            t_push = time.time()
            name = f"app-{app:05d}"
            wait(lambda s=sha, a=name: a in statuses.on(s), 120, f"the status of {name}",
                 interval=0.05)
            lat.append(time.time() - t_push)
            time.sleep(max(0.0, push_every - (time.monotonic() - t_slot)))
        out["push_to_status_s"] = {"n": len(lat), "p50": pct(lat, 0.5), "p99": pct(lat, 0.99),
                                   "max": round(max(lat), 3)}
        # One commit changing 100 apps.
        apps = sorted({ids[(j * 104729) % len(ids)] for j in range(100)})
        for a in apps:
            write_app(repo, a, v=10_000)
        sha = repo.commit("100 apps")
        t_push = time.time()
        want = {f"app-{a:05d}" for a in apps}
        wait(lambda: want <= statuses.on(sha), 300, "100 statuses", interval=0.1)
        out["commit_100_apps_s"] = round(time.time() - t_push, 2)
        # Idle.
        time.sleep(2)
        pids = [d.proc.pid for d in procs]
        ticks0 = sum(proc_sample(p)[0] for p in pids)
        rss: list[int] = []
        t_start = time.monotonic()
        while time.monotonic() - t_start < idle_seconds:
            time.sleep(1.0)
            rss.append(max(proc_sample(p)[1] for p in pids))
        samples = [proc_sample(p) for p in pids]
        elapsed = time.monotonic() - t_start
        out["idle_cpu_percent"] = round(100.0 * (sum(s[0] for s in samples) - ticks0) / CLK_TCK / elapsed, 2)
        out["idle_rss_mb_max"] = round(max(rss) / 1024, 1)
        out["idle_rss_mb_median"] = round(statistics.median(rss) / 1024, 1)
        out["idle_rss_mb_end"] = round(max(s[1] for s in samples) / 1024, 1)
        out["peak_rss_mb"] = round(max(s[2] for s in samples) / 1024, 1)
        out["errors_in_logs"] = sum(1 for d in procs for r in d.log() if r.get("level") in ("ERROR", "CRITICAL"))
    finally:
        for d in procs:
            d.stop()
    return out


def shard_holders(kube: Any, namespace: str, shards: int) -> dict[int, str | None]:
    """Shard -> holder identity, read from the shard Leases on the (stand-in) API server."""
    out: dict[int, str | None] = {}
    for i in range(shards):
        lease = kube.get("Lease", namespace, f"flink-reconciler-shard-{i}")
        out[i] = ((lease or {}).get("spec") or {}).get("holderIdentity")
    return out


def takeover(root: Path, n: int, shards: int, *, changed: int = 50) -> dict[str, Any]:
    """`shard: auto` with `shards` replicas against the stand-in API server (dry run, git-notes statuses):
    SIGKILL the replica holding a shard, push a commit changing `changed` apps of that shard, and time
    kill -> the shard's Lease held by another replica -> every one of those apps' statuses on the origin."""
    from kubernetes import client as k8s_client

    from reconciler.live.kubernetes.api import Kube
    from reconciler.service.sharding import shard_of
    from tests.kubernetes.standin import Standin

    ns = "flink-reconciler"
    repo = Repo(root)
    for i in range(n):
        write_app(repo, i, template=K8S_SPEC)
    head = repo.commit(f"{n} apps")
    statuses = OriginStatuses(repo)
    out: dict[str, Any] = {"apps": n, "replicas": shards, "shards": shards, "poll_s": POLL,
                           "lease_duration_s": 15.0}
    with Standin() as standin:
        kubeconfig = root / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: s, cluster: {{server: \"{standin.url}\"}}}}]\n"
            "users: [{name: u, user: {token: stand-in-token}}]\n"
            f"contexts: [{{name: c, context: {{cluster: s, user: u, namespace: {ns}}}}}]\ncurrent-context: c\n")
        cfg = k8s_client.Configuration()
        cfg.host = standin.url
        cfg.api_key["BearerToken"] = "Bearer stand-in-token"
        kube = Kube(k8s_client.ApiClient(cfg))
        t0 = time.time()
        procs = [DaemonProc.start(root / f"daemon-{k}.log", repo_url=repo.origin, state_dir=root / f"state-{k}",
                                  dry_run=True, poll_interval=POLL, drift_interval=DRIFT, status_sink="notes",
                                  runtime="kubernetes", kubeconfig=kubeconfig, namespaces="flink", lease_namespace=ns,
                                  shards=shards, shard="auto") for k in range(shards)]
        try:
            wait(lambda: len(statuses.on(head)) >= n, 1800, f"{n} statuses on the origin", interval=0.2)
            out["startup_statuses_on_origin_s"] = round(time.time() - t0, 1)
            by_pid = {d.proc.pid: d for d in procs}

            def balanced() -> bool:
                holders = shard_holders(kube, ns, shards)
                return None not in holders.values() and len(set(holders.values())) == shards

            wait(balanced, 300, "one shard per replica", interval=0.5)
            holders = shard_holders(kube, ns, shards)
            out["balanced_s"] = round(time.time() - t0, 1)
            victim_shard = 0
            identity = holders[victim_shard]
            assert identity is not None
            victim = by_pid[int(identity.rsplit("-", 1)[1])]
            time.sleep(5)  # idle: a settled fleet
            out["idle_rss_mb_per_replica"] = sorted(round(proc_sample(d.proc.pid)[1] / 1024, 1) for d in procs)
            apps = [i for i in range(n) if shard_of(f"app-{i:05d}", shards) == victim_shard][:changed]
            t_kill = time.time()
            victim.proc.kill()
            victim.proc.wait()
            for a in apps:
                write_app(repo, a, v=20_000, template=K8S_SPEC)
            sha = repo.commit(f"{len(apps)} apps of shard {victim_shard}")
            want = {f"app-{a:05d}" for a in apps}
            wait(lambda: shard_holders(kube, ns, shards)[victim_shard] not in (None, identity), 120,
                 "the shard's Lease taken over", interval=0.2)
            out["kill_to_lease_taken_s"] = round(time.time() - t_kill, 1)
            wait(lambda: want <= statuses.on(sha), 600, "the lost shard's statuses", interval=0.2)
            out["kill_to_statuses_s"] = round(time.time() - t_kill, 1)
            out["changed_apps"] = len(apps)
            new_holder = shard_holders(kube, ns, shards)[victim_shard]
            out["new_holder_is_another_replica"] = new_holder not in (None, identity)
            out["errors_in_logs"] = sum(1 for d in procs for r in d.log() if r.get("level") in ("ERROR", "CRITICAL"))
        finally:
            for d in procs:
                d.stop()
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    out = [f"Dry-run daemon, git-notes statuses, poll {POLL:g} s, drift {DRIFT:g} s", "",
           "| apps | processes | first pass s | start -> all statuses on origin s | push -> status p50 / p99 / max s "
           "| 100-app commit s | idle CPU % | idle RSS MB median / max (largest process) | peak RSS MB |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        p = r["push_to_status_s"]
        procs = f"{r['shards']}" if r.get("only_shard") is None else f"shard {r['only_shard']} of {r['shards']}, alone"
        out.append(f"| {r['apps']} | {procs} | {r['first_pass_s']:.2f} | {r['startup_statuses_on_origin_s']:.1f}"
                   f" | {p['p50']:.2f} / {p['p99']:.2f} / {p['max']:.2f} ({p['n']} pushes) | "
                   f"{r['commit_100_apps_s']:.2f} | {r['idle_cpu_percent']:.2f} | {r['idle_rss_mb_median']:.1f} / "
                   f"{r['idle_rss_mb_max']:.1f} | {r['peak_rss_mb']:.1f} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="1000x1,10000x1", help="APPSxPROCESSES,...")
    ap.add_argument("--push-every", type=float, default=2.5)
    ap.add_argument("--stream-seconds", type=float, default=75.0)
    ap.add_argument("--idle-seconds", type=float, default=60.0)
    ap.add_argument("--takeover", default="", help="APPSxREPLICAS: time a killed shard: auto replica's takeover")
    ap.add_argument("--pymalloc", action="store_true",
                    help="run the daemons with Python's own allocator, not the image's PYTHONMALLOC=malloc")
    args = ap.parse_args()
    if not args.pymalloc:  # what deploy/Dockerfile sets: measure the daemon as it runs in the image
        os.environ.setdefault("PYTHONMALLOC", "malloc")
        os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    # The image's pip install compiles the package's bytecode; a source checkout run with
    # PYTHONDONTWRITEBYTECODE=1 would compile every module at every daemon start (0.1 s of CPU each).
    subprocess.run([sys.executable, "-m", "compileall", "-q", "reconciler"], cwd=Path(__file__).resolve().parents[1],
                   check=True)
    result: dict[str, Any] = {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg(), "runs": [],
                              "pythonmalloc": os.environ.get("PYTHONMALLOC", "pymalloc")}
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp:
        if args.takeover:
            n, _, s = args.takeover.partition("x")
            root = Path(tmp) / f"takeover-{args.takeover}"
            root.mkdir()
            result["takeover"] = takeover(root, int(n), int(s or 5))
            print(f"[takeover] {result['takeover']}", file=sys.stderr, flush=True)
        for cfg in filter(None, args.config.split(",")):
            n, _, rest = cfg.partition("x")
            s, _, only = rest.partition("@")
            root = Path(tmp) / cfg
            root.mkdir()
            result["runs"].append(scale(root, int(n), int(s or 1), push_every=args.push_every,
                                        stream_seconds=args.stream_seconds, idle_seconds=args.idle_seconds,
                                        only=int(only) if only else None))
            print(f"[scale] {result['runs'][-1]}", file=sys.stderr, flush=True)
    result["loadavg_end"] = os.getloadavg()
    print(json.dumps(result, indent=2))
    print()
    if result["runs"]:
        print(markdown(result["runs"]))
    if "takeover" in result:
        t = result["takeover"]
        print(f"Takeover (shard: auto, {t['replicas']} replicas, {t['apps']} apps, Lease {t['lease_duration_s']:g} s, "
              f"poll {t['poll_s']:g} s): SIGKILL -> Lease taken {t['kill_to_lease_taken_s']} s -> "
              f"{t['changed_apps']} changed apps of its shard have statuses {t['kill_to_statuses_s']} s")


if __name__ == "__main__":
    main()
