"""The daemon's HTTP under a hostile client, on loopback only: does anyone else still get served?

Starts a real `flink-reconciler run` (dry run, a bare Git origin with --apps specs, the dashboard on, a GitHub
webhook secret) from the checkout at --root (this one by default; give another checkout, e.g. main's, for the
"before" figure), then for --seconds:

- the attacker, 127.0.0.1: --slow connections that each send a partial request head and one more byte a
  second, reconnecting at once when the server cuts or refuses them (a slowloris);
- the same attacker, from 127.0.0.3: a burst of --burst dashboard page loads (`GET /`, Accept text/html),
  50 at a time, each on a connection of its own;
- the kubelet, 127.0.0.4: `GET /healthz` every 0.5 s on the probe port (on the public port for a daemon that
  has none), with the kubelet's default 1 s timeout;
- another client, 127.0.0.2: the dashboard (`GET /`, Accept text/html) every 0.25 s, timed;
- a forge, 127.0.0.5: one signed GitHub push in the middle.

Prints what each of them got, and the daemon's peak RSS and thread count (/proc). Every loop is bounded by
the duration; every address is on loopback. Not a test: nothing is asserted.

Run: .venv/bin/python bench/http_bench.py [--root /path/to/checkout] [--slow 500] [--burst 1000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.gitutil import Repo, spec

ROOT = Path(__file__).resolve().parents[1]
SECRET = "bench-webhook-secret"
ATTACKER, OTHER, BURSTER, KUBELET, FORGE = "127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"


def start_daemon(root: Path, tmp: Path, apps: int) -> tuple[subprocess.Popen[bytes], Path]:
    (tmp / "repo").mkdir()
    repo = Repo(tmp / "repo")
    for i in range(apps):
        repo.write(f"apps/app-{i:05d}.yaml", spec(f"app-{i:05d}", parallelism=1 + i % 3))
    repo.commit(f"{apps} apps")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLINK_RECONCILER_")}
    env |= {"FLINK_RECONCILER_REPO_URL": str(repo.origin), "FLINK_RECONCILER_STATE_DIR": str(tmp / "state"),
            "FLINK_RECONCILER_DRY_RUN": "true", "FLINK_RECONCILER_LISTEN_PORT": "0",
            "FLINK_RECONCILER_PROBE_PORT": "0", "FLINK_RECONCILER_LOG_FORMAT": "json",
            "FLINK_RECONCILER_STATUS_SINK": "none", "FLINK_RECONCILER_GITHUB_WEBHOOK_SECRET": SECRET,
            "FLINK_RECONCILER_POLL_INTERVAL": "3600", "FLINK_RECONCILER_DRIFT_INTERVAL": "3600",
            "FLINK_RECONCILER_LOG_LEVEL": "INFO", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(root)}
    log = tmp / "daemon.log"
    proc = subprocess.Popen([sys.executable, "-m", "reconciler.cli", "run"], cwd=root, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log.open("wb"))
    return proc, log


def urls(log: Path, proc: subprocess.Popen[bytes]) -> tuple[tuple[str, int], tuple[str, int]]:
    """(public, probes) addresses from the daemon's log; a daemon without a probe port: (public, public)."""
    deadline = time.monotonic() + 60
    public = probes = None
    while time.monotonic() < deadline and proc.poll() is None:
        for line in log.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            msg = str(rec.get("msg", ""))
            if msg.startswith("listening on"):
                public = (rec["host"], int(rec["port"]))
            elif msg.startswith("probes and metrics on"):
                probes = (rec["host"], int(rec["port"]))
            elif msg == "daemon started" and public:
                return public, probes or public
        time.sleep(0.1)
    raise SystemExit(f"the daemon did not start:\n{log.read_text(errors='replace')[-3000:]}")


async def request(addr: tuple[str, int], source: str, raw: bytes, timeout: float) -> tuple[int, float]:
    """(status, seconds) of one request on a connection of its own; status 0: no answer in time, -1: the
    connection failed or was cut."""
    t0 = time.monotonic()
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(addr[0], addr[1], local_addr=(source, 0))
            writer.write(raw)
            await writer.drain()
            data = await reader.read()
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    except TimeoutError:
        status = 0
    except (OSError, ValueError, IndexError):
        status = -1
    finally:
        if writer is not None:
            writer.close()
    return status, time.monotonic() - t0


def get(path: str, *, html: bool = False) -> bytes:
    accept = b"text/html" if html else b"*/*"
    return (b"GET " + path.encode() + b" HTTP/1.1\r\nHost: localhost\r\nAccept: " + accept
            + b"\r\nConnection: close\r\n\r\n")


async def slowloris(addr: tuple[str, int], n: int, until: float, stats: dict[str, int]) -> None:
    async def one() -> None:
        while time.monotonic() < until:
            writer = None
            try:
                reader, writer = await asyncio.open_connection(addr[0], addr[1], local_addr=(ATTACKER, 0))
                stats["opened"] += 1
                writer.write(b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
                await writer.drain()
                while time.monotonic() < until:
                    await asyncio.sleep(1.0)
                    if reader.at_eof():
                        raise ConnectionResetError
                    writer.write(b"a")
                    await writer.drain()
            except OSError:
                stats["cut"] += 1
                await asyncio.sleep(0.05)
            finally:
                if writer is not None:
                    writer.close()

    await asyncio.gather(*(one() for _ in range(n)))


async def burst(addr: tuple[str, int], n: int, until: float) -> tuple[dict[int, int], list[float]]:
    counts: dict[int, int] = {}
    served: list[float] = []
    queue = list(range(n))

    async def worker() -> None:
        while queue and time.monotonic() < until:
            queue.pop()
            status, took = await request(addr, BURSTER, get("/", html=True), 10)
            counts[status] = counts.get(status, 0) + 1
            if status == 200:
                served.append(took)

    await asyncio.gather(*(worker() for _ in range(50)))
    return counts, served


async def every(period: float, until: float, fn: object) -> list[tuple[int, float]]:
    out = []
    while time.monotonic() < until:
        t0 = time.monotonic()
        out.append(await fn())  # type: ignore[operator]
        await asyncio.sleep(max(0.0, period - (time.monotonic() - t0)))
    return out


def push() -> bytes:
    body = json.dumps({"ref": "refs/heads/main", "before": "0" * 40, "after": "1" * 40}).encode()
    sig = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return (b"POST /webhook HTTP/1.1\r\nHost: localhost\r\nX-GitHub-Event: push\r\nContent-Type: application/json"
            b"\r\nX-Hub-Signature-256: sha256=" + sig.encode() + b"\r\nContent-Length: " + str(len(body)).encode()
            + b"\r\nConnection: close\r\n\r\n" + body)


async def sample(pid: int, until: float, peak: dict[str, int]) -> None:
    while time.monotonic() < until:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return
        for line in status.splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "Threads"):
                peak[key] = max(peak.get(key, 0), int(value.split()[0]))
        peak["fds"] = max(peak.get("fds", 0), len(os.listdir(f"/proc/{pid}/fd")))
        await asyncio.sleep(0.5)


async def attack(public: tuple[str, int], probes: tuple[str, int], pid: int,
                 args: argparse.Namespace) -> dict[str, object]:
    t0 = time.monotonic()
    until = t0 + args.seconds
    slow = {"opened": 0, "cut": 0}
    peak: dict[str, int] = {}
    idle: dict[str, int] = {}
    await sample(pid, time.monotonic() + 0.1, idle)
    tasks = [asyncio.create_task(slowloris(public, args.slow, until, slow)),
             asyncio.create_task(sample(pid, until, peak))]
    await asyncio.sleep(3)  # the slow connections are in place
    burst_task = asyncio.create_task(burst(public, args.burst, until))
    probe_task = asyncio.create_task(every(0.5, until, lambda: request(probes, KUBELET, get("/healthz"), 1.0)))
    other_task = asyncio.create_task(every(0.25, until, lambda: request(public, OTHER, get("/", html=True), 5.0)))
    await asyncio.sleep(max(0.0, (until - time.monotonic()) / 2))
    webhook = await request(public, FORGE, push(), 10)
    probe, other, (bursted, burst_took) = await probe_task, await other_task, await burst_task
    await asyncio.gather(*tasks)
    took = sorted(s for st, s in other if st == 200)
    p99 = took[min(len(took) - 1, int(len(took) * 0.99))] if took else float("nan")
    return {
        "healthz_ok": f"{sum(st == 200 for st, _ in probe)}/{len(probe)}",
        "other_client_ok": f"{sum(st == 200 for st, _ in other)}/{len(other)}",
        "other_client_answers": {str(k): sum(st == k for st, _ in other) for k in sorted({st for st, _ in other})},
        "other_client_p50_ms": round(statistics.median(took) * 1000) if took else None,
        "other_client_p99_ms": round(p99 * 1000) if took else None,
        "webhook_push": webhook[0],
        "burst_answers": {str(k): v for k, v in sorted(bursted.items())},
        "burst_served_p50_ms": round(statistics.median(burst_took) * 1000) if burst_took else None,
        "slow_connections_opened": slow["opened"], "slow_connections_cut_or_refused": slow["cut"],
        "rss_idle_mib": round(idle.get("VmRSS", 0) / 1024), "rss_peak_mib": round(peak.get("VmRSS", 0) / 1024),
        "threads_idle": idle.get("Threads"), "threads_peak": peak.get("Threads"), "fds_peak": peak.get("fds"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose daemon is measured")
    ap.add_argument("--apps", type=int, default=200)
    ap.add_argument("--slow", type=int, default=500)
    ap.add_argument("--burst", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    args.seconds = min(args.seconds, 120.0)
    args.slow = min(args.slow, 2000)
    with tempfile.TemporaryDirectory(prefix="http-bench-") as tmp:
        proc, log = start_daemon(args.root.resolve(), Path(tmp), args.apps)
        try:
            public, probes = urls(log, proc)
            result = asyncio.run(attack(public, probes, proc.pid, args))
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    result = {"root": str(args.root), "apps": args.apps, "slow": args.slow, "burst": args.burst,
              "seconds": args.seconds, **result}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
