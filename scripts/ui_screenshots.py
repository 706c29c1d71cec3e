"""Take the screenshots of docs/ui.md: a real Git repository (bare origin), records written as the executor
writes them (tests/ui/records.py: an upgrade in flight, a failed one, apps in sync and out of sync), then
`flink-reconciler ui` over them, photographed by headless Debian chromium (Playwright, `executable_path`).

Run: .venv/bin/python scripts/ui_screenshots.py [--out docs/images]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reconciler.apply.journal import Journal  # noqa: E402
from reconciler.clock import SystemClock  # noqa: E402
from reconciler.core.observed import Outcome  # noqa: E402
from reconciler.spec.load import LoadResult, load_dir  # noqa: E402
from tests.gitutil import Repo, spec  # noqa: E402
from tests.ui.browser import CHROMIUM, FLAGS  # noqa: E402
from tests.ui.records import execute, plans  # noqa: E402

APPS = {"orders": "team-a", "payments": "team-a", "clicks": "team-b", "sessions": "team-b", "inventory": "team-c",
        "fraud-scoring": "team-c", "recommendations": "team-b", "audit-log": "team-a"}


LONG_FAILURE = ("StartJob failed: org.apache.flink.runtime.client.JobInitializationException: Could not start the "
                "JobMaster.\n" + "".join(f"\tat org.example.fraud.Stage{i % 7}.open(Stage{i % 7}.java:{40 + i % 50})\n"
                                        for i in range(2000)) + "Caused by: java.io.FileNotFoundException: model.bin")


def _spec(name: str, parallelism: int = 1) -> str:
    text = spec(name, parallelism=parallelism)
    return text.replace(f"  name: {name}\n", f"  name: {name}\n  namespace: {APPS[name]}\n")


def build(root: Path) -> Repo:
    repo = Repo(root)
    for name in APPS:
        repo.write(f"apps/{name}.yaml", _spec(name))
    first = repo.commit("Add the streaming apps of teams a, b and c")
    clock = SystemClock()
    journal = Journal(root / "state" / "journal", clock)
    base = load_dir(repo.work / "apps")
    for ap in plans(LoadResult(), base, base_revision="0" * 40, revision=first, now=clock.now()):
        execute(journal, first, ap)
    for name, p in (("orders", 2), ("payments", 3), ("sessions", 2)):
        repo.write(f"apps/{name}.yaml", _spec(name, p))
    second = repo.commit("Scale orders, payments and sessions for the sale")
    head = load_dir(repo.work / "apps")
    by_app = {ap.app: ap for ap in plans(base, head, base_revision=first, revision=second, now=clock.now())}
    execute(journal, second, by_app["sessions"])
    execute(journal, second, by_app["payments"], outcome=Outcome.FAILURE,
            message="rolled back: AwaitRunning failed: the job did not reach RUNNING within 120s (Flink: "
                    "java.lang.ClassNotFoundException: com.example.PaymentsJob); the previous spec runs again "
                    "from the savepoint just taken. Fix the spec and push a new commit (or bump restartNonce)")
    execute(journal, second, by_app["orders"], stop_at=2)
    # hostile text: a bidi override in a commit subject, a stack trace of 2,000 lines as a failure message
    repo.write("apps/audit-log.yaml", _spec("audit-log", 2))
    repo.write("apps/fraud-scoring.yaml", _spec("fraud-scoring", 2))
    third = repo.commit("audit-log: add the logo gnp\u202eexe.png")
    mid = load_dir(repo.work / "apps")
    by_app = {ap.app: ap for ap in plans(head, mid, base_revision=second, revision=third, now=clock.now())}
    execute(journal, third, by_app["audit-log"])
    execute(journal, third, by_app["fraud-scoring"], outcome=Outcome.FAILURE, message=LONG_FAILURE)
    repo.write("apps/clicks.yaml", _spec("clicks", 4))
    repo.commit("clicks: parallelism 4")
    return repo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ui-shots-") as tmp:
        repo = build(Path(tmp))
        proc = subprocess.Popen([sys.executable, "-m", "reconciler.cli", "ui", "--listen", "127.0.0.1:0",
                                 "--state-dir", str(Path(tmp) / "state"), "--repo", str(repo.origin), "--dry-run",
                                 "--cache-dir", str(Path(tmp) / "cache")], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        try:
            assert proc.stdout is not None
            m = re.search(r"dashboard: (http://\S+?)/ ", proc.stdout.readline())
            assert m, "no dashboard URL"
            url = m.group(1)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
                shots = [("ui-overview.png", "/", 1280, 720, "light", None),
                         ("ui-app.png", "/apps/orders", 1280, 1000, "light", None),
                         ("ui-failed-dark.png", "/apps/payments", 1280, 820, "dark", None),
                         ("ui-phone.png", "/", 390, 844, "light", None),
                         ("ui-long-text.png", "/apps/fraud-scoring", 1280, 900, "light", "#failure details.long"),
                         ("ui-plan.png", "/plan", 1280, 720, "light", None)]
                for name, path, width, height, scheme, open_ in shots:
                    page = browser.new_page(viewport={"width": width, "height": height}, color_scheme=scheme)
                    page.goto(url + path)
                    page.wait_for_timeout(1500)  # the rows are read in the background at start
                    page.goto(url + path)
                    page.wait_for_timeout(300)
                    if open_:  # a long message: opened, scrolled to
                        page.locator(open_ + " summary").click()
                        page.locator(open_).evaluate("e => window.scrollTo(0, e.getBoundingClientRect().top"
                                                     " + window.scrollY - 200)")
                    page.screenshot(path=str(args.out / name))
                    page.close()
                    print(args.out / name)
                browser.close()
        finally:
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    main()
