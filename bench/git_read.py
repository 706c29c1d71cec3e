"""Benchmark the Git source's hot paths on synthetic repos of 100, 1,000 and 10,000 spec files.

Run: .venv/bin/python bench/git_read.py [--sizes 100,1000,10000] [--repeat 5]
Prints one JSON line per size and a Markdown table. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reconciler.source.git import GitSource

SPEC = """apiVersion: flink.reconciler/v1
kind: FlinkApp
metadata:
  name: app-{i:05d}
spec:
  image: flink:2.3
  job:
    jarURI: local:///opt/job.jar
    parallelism: {p}
    upgradeMode: savepoint
"""


def make_origin(root: Path, n: int) -> Path:
    """A bare repo with two commits: n apps, then one app changed (built with git fast-import)."""
    origin = root / f"origin-{n}.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
    lines: list[bytes] = []

    def blob(mark: int, data: bytes) -> None:
        lines.append(b"blob\nmark :%d\ndata %d\n%s\n" % (mark, len(data), data))

    for i in range(n):
        blob(i + 1, SPEC.format(i=i, p=2).encode())
    blob(n + 1, SPEC.format(i=0, p=4).encode())
    ts = int(time.time())
    lines.append(
        b"commit refs/heads/main\nmark :%d\ncommitter Bench <b@x> %d +0000\ndata 4\nall\n" % (n + 2, ts)
    )
    for i in range(n):
        lines.append(b"M 100644 :%d apps/app-%05d.yaml\n" % (i + 1, i))
    lines.append(
        b"commit refs/heads/main\nmark :%d\ncommitter Bench <b@x> %d +0000\ndata 3\none\nfrom :%d\n"
        b"M 100644 :%d apps/app-00000.yaml\n" % (n + 3, ts + 1, n + 2, n + 1)
    )
    subprocess.run(["git", "fast-import", "--quiet"], cwd=origin, input=b"".join(lines), check=True)
    return origin


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time in ms."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def bench(n: int, repeat: int, root: Path) -> dict[str, float | int]:
    origin = make_origin(root, n)
    src = GitSource(str(origin), root / f"cache-{n}")
    t0 = time.perf_counter()
    src.fetch()
    clone_ms = (time.perf_counter() - t0) * 1000
    head = src.resolve("main")
    base = src.resolve("main~1")
    files = src.read_tree(head, "apps")
    assert len(files) == n
    return {
        "files": n,
        "clone_ms": round(clone_ms, 1),
        "fetch_noop_ms": round(timed(src.fetch, repeat), 1),
        "read_tree_ms": round(timed(lambda: src.read_tree(head, "apps"), repeat), 1),
        "changed_paths_ms": round(timed(lambda: src.changed_paths(base, head, "apps"), repeat), 1),
        "read_paths_1_ms": round(timed(lambda: src.read_paths(head, ["apps/app-00000.yaml"]), repeat), 1),
        "resolve_ms": round(timed(lambda: src.resolve("main"), repeat), 1),
        "bytes": sum(len(v) for v in files.values() if isinstance(v, bytes)),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            row = bench(n, args.repeat, Path(tmp))
            print(json.dumps(row))
            rows.append(row)
    cols = list(rows[0])
    print()
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in cols) + " |")


if __name__ == "__main__":
    main()
