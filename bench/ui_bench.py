"""The dashboard's overview at 100, 1,000 and 10,000 apps: time to the first byte and size of the HTML.

For each size: a real Git repository (bare origin) with N specs, records for every app written through the
Journal over a FileRecordStore as the executor writes them (tests/ui/records.py; no Flink), then
`flink-reconciler ui` over them and GET / (as a browser: Accept text/html) a few times. Prints the first
request right after start (answered at once: the rows are still being read), how long the first read of
every record takes, the first full page, and the median of the next ones (what a page left open costs each
refresh), plus the size of the page. Goals: first byte <= 300 ms, <= 2 MB of HTML.

Run: .venv/bin/python bench/ui_bench.py [--sizes 100,1000,10000] [--repeat 5]
Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.spec.load import LoadResult, load_dir
from tests.gitutil import Repo, spec
from tests.ui.records import execute, plans

ROOT = Path(__file__).resolve().parents[1]


def first_byte(url: str) -> tuple[float, int]:
    """Seconds from connect to the first byte of the answer, and the body's size (raw socket: no client
    library's overhead in the figure)."""
    host, port = url.split("//")[1].split(":")
    t0 = time.perf_counter()
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"GET / HTTP/1.0\r\nHost: localhost\r\nAccept: text/html\r\n\r\n")
        first = s.recv(65536)
        t_first = time.perf_counter() - t0
        data = first
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200"), head[:200]
    return t_first, len(body)


def fetch(url: str) -> bytes:
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"GET / HTTP/1.0\r\nHost: localhost\r\nAccept: text/html\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def measure(n: int, repeat: int, root: Path) -> dict[str, object]:
    repo = Repo(root)
    for i in range(n):
        repo.write(f"apps/app-{i:05d}.yaml", spec(f"app-{i:05d}", parallelism=1 + i % 3))
    rev = repo.commit(f"{n} apps")
    clock = SystemClock()
    journal = Journal(root / "state" / "journal", clock)
    t0 = time.perf_counter()
    for ap in plans(LoadResult(), load_dir(repo.work / "apps"), base_revision="0" * 40, revision=rev,
                    now=clock.now()):
        execute(journal, rev, ap)
    write_s = time.perf_counter() - t0
    proc = subprocess.Popen([sys.executable, "-m", "reconciler.cli", "ui", "--listen", "127.0.0.1:0",
                             "--state-dir", str(root / "state"), "--repo", str(repo.origin),
                             "--cache-dir", str(root / "cache")], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "FLINK_RECONCILER_DRY_RUN": "true"})
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[1].rstrip("/")
        started = time.perf_counter()
        cold, _ = first_byte(url)  # at once: rows not built yet (a "reading the records" page)
        while b"Reading the records" in fetch(url):  # the first read of every record, in the background
            time.sleep(0.05)
        ready_s = time.perf_counter() - started
        warm, size = first_byte(url)
        warm_runs = [first_byte(url)[0] for _ in range(repeat)]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return {"apps": n, "records_write_s": round(write_s, 1), "first_byte_at_start_ms": round(cold * 1000),
            "rows_ready_after_start_s": round(ready_s, 2), "first_byte_first_full_page_ms": round(warm * 1000),
            "first_byte_warm_median_ms": round(statistics.median(warm_runs) * 1000),
            "first_byte_warm_max_ms": round(max(warm_runs) * 1000), "html_kib": round(size / 1024)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    results = []
    for n in (int(x) for x in args.sizes.split(",")):
        with tempfile.TemporaryDirectory(prefix=f"ui-bench-{n}-") as tmp:
            results.append(measure(n, args.repeat, Path(tmp)))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(json.dumps(results, indent=2))
    print("\n| apps | first byte at start | rows ready after | first full page | refresh (median / max) | HTML |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r['apps']:,} | {r['first_byte_at_start_ms']} ms | {r['rows_ready_after_start_s']} s | "
              f"{r['first_byte_first_full_page_ms']} ms | {r['first_byte_warm_median_ms']} / "
              f"{r['first_byte_warm_max_ms']} ms | {r['html_kib']} KiB |")


if __name__ == "__main__":
    main()
