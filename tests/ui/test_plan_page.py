"""/plan's pages (ui/read.plan_page): `plan`'s text cut per app, a page of apps at a time, secrets masked."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from reconciler.core import render
from reconciler.core.planner import Policy, offline_input, plan
from reconciler.spec.load import load_dir
from reconciler.ui.read import plan_page
from tests.gitutil import spec

NOW = datetime(2026, 12, 5, tzinfo=UTC)


def _plan(tmp_path: Path, n: int, secret: str) -> object:
    """n creates, and an upgrade of `changed` whose diff changes a secret-looking value to `secret`."""
    base, head = tmp_path / "base", tmp_path / "head"
    for d, value in ((base, "old-value-1"), (head, secret)):
        d.mkdir()
        (d / "changed.yaml").write_text(spec("changed", extra=f"  flinkConfiguration:\n    s3.secret-key: {value}\n"))
    for i in range(n - 1):
        (head / f"app-{i:03d}.yaml").write_text(spec(f"app-{i:03d}"))
    return plan(offline_input(load_dir(base), load_dir(head), base_revision="0" * 40, revision="a" * 40,
                              now=NOW, policy=Policy()))


def test_pages_hold_every_app_once_in_plans_order(tmp_path: Path) -> None:
    p = _plan(tmp_path, 7, "hunter2-secret")
    pages = [plan_page(p, i, per_page=3) for i in (1, 2, 3)]  # type: ignore[arg-type]
    assert [(pg.page, pg.pages, pg.first, pg.last) for pg in pages] == [(1, 3, 1, 3), (2, 3, 4, 6), (3, 3, 7, 7)]
    names = [b.name for pg in pages for b in pg.blocks]
    assert names == [a.app for a in render.sorted_apps(p)]  # type: ignore[arg-type]
    assert pages[0].head[1] == "7 apps: 1 upgrade (savepoint), 6 create"
    assert plan_page(p, 99, per_page=3).page == 3 and plan_page(p, -1, per_page=3).page == 1  # type: ignore[arg-type]
    # the page's blocks are to_text's lines, with the diff's secret masked
    text = render.to_text(p)  # type: ignore[arg-type]
    for b in pages[0].blocks:
        assert b.head in text and b.changes
    whole = "\n".join(ln for pg in pages for b in pg.blocks for ln in (b.head, *b.lines))
    assert "hunter2-secret" not in whole and "/spec/flinkConfiguration/s3.secret-key: ***" in whole, whole
