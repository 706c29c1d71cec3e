"""ReadSide.app: a page for every row that exists (an app only in the records, only in the branch tip, or a
row named after a spec file that does not parse), and none for a name no row has; ReadSide.plan: computed
in the background, once per tip."""

from __future__ import annotations

from pathlib import Path

from reconciler.apply.journal import Journal
from reconciler.clock import SystemClock
from reconciler.core.plan import Plan
from reconciler.source.git import GitSource
from reconciler.source.specs import load_at
from reconciler.spec.load import LoadResult, load_dir
from reconciler.ui.model import Tip
from reconciler.ui.read import ReadSide
from tests.gitutil import Repo, spec
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


def test_the_plan_is_computed_in_the_background_and_kept_per_tip(tmp_path: Path) -> None:
    """A plan of 10,000 apps takes longer than a request may: /plan answers at once (None, None: computing)
    and the plan is there on a later request, computed once per branch tip."""
    repo = Repo(tmp_path)
    repo.write("apps/orders.yaml", spec("orders"))
    repo.commit("orders")
    repo.write("apps/orders.yaml", spec("orders", parallelism=2))
    repo.write("apps/clicks.yaml", spec("clicks"))
    rev = repo.commit("orders p=2, clicks")
    source = GitSource(str(repo.origin), tmp_path / "cache")
    source.fetch()
    tip = Tip(rev, load_at(source, rev, "apps"))
    clock = SystemClock()
    read = ReadSide(journals=lambda: [Journal(tmp_path / "journal", clock)], tip=lambda: tip, clock=clock,
                    source=source, subdir="apps")
    assert read.plan(wait_s=0) == (tip, None, None)  # computing
    got: tuple[Tip | None, Plan | None, str | None] = (tip, None, None)
    for _ in range(300):
        got = read.plan(wait_s=0.1)
        if got[1] is not None:
            break
    _, p, why = got
    assert why is None and p is not None
    assert {a.app: a.action.value for a in p.apps} == {"orders": "upgrade", "clicks": "create"}
    assert read.plan(wait_s=0)[1] is p  # kept for this tip
