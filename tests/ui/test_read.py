"""ReadSide.app: a page for every row that exists (an app only in the records, only in the branch tip, or a
row named after a spec file that does not parse), and none for a name no row has."""

from __future__ import annotations

from pathlib import Path

from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.spec.load import LoadResult, load_dir
from reconciler.ui.model import Tip
from reconciler.ui.read import ReadSide
from tests.gitutil import spec
from tests.ui.records import execute, plans


def test_app_pages_exist_exactly_for_the_rows(tmp_path: Path) -> None:
    clock = SystemClock()
    journal = Journal(tmp_path / "journal", clock)
    applied = tmp_path / "applied"
    applied.mkdir()
    (applied / "gone.yaml").write_text(spec("gone"))
    for ap in plans(LoadResult(), load_dir(applied), base_revision="0" * 40, revision="a" * 40, now=clock.now()):
        execute(journal, "a" * 40, ap)
    tip_dir = tmp_path / "tip"
    tip_dir.mkdir()
    (tip_dir / "orders.yaml").write_text(spec("orders"))
    (tip_dir / "broken.yaml").write_text("metadata: [unclosed\n")
    loaded = load_dir(tip_dir)
    read = ReadSide(journals=lambda: [journal], tip=lambda: Tip("b" * 40, loaded), clock=clock)
    rows = {r.name for r in read.rows(fresh=True)[0]}
    assert {"gone", "orders"} <= rows and len(rows) == 3
    for name in rows:  # only in the records, only in the tip, named after a file
        detail = read.app(name)
        assert detail is not None and detail.row.name == name
    for name in ("nope", "", "orders2", "gon"):
        assert read.app(name) is None
    fresh = ReadSide(journals=lambda: [journal], tip=lambda: Tip("b" * 40, loaded), clock=clock)
    assert fresh.app("gone") is not None  # no rows built yet: found from the journal
