"""The dashboard's pure parts: the sync-state rules (table), selection, forge links, the config redaction."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from reconciler.core.observed import AppRecord, Outcome
from reconciler.logs import redact_config
from reconciler.redaction import REDACTED, looks_secret
from reconciler.spec.load import load_files
from reconciler.ui.forge import commit_url
from reconciler.ui.model import AppRow, Query, select, sync_state
from tests.gitutil import spec

A1 = load_files({"a.yaml": spec("a").encode()}).apps["a"]
A2 = load_files({"a.yaml": spec("a", parallelism=2).encode()}).apps["a"]
AS = load_files({"a.yaml": spec("a", extra="    state: suspended\n").encode()}).apps["a"]
H1, H2 = A1.app.spec_hash, A2.app.spec_hash
T = datetime(2026, 1, 1, tzinfo=UTC)


def rec(**kw: Any) -> AppRecord:
    return AppRecord(name="a", **kw)


@dataclass(frozen=True)
class Row:
    why: str
    record: AppRecord | None
    desired: Any
    applied_hash: str | None
    expect: str
    broken: str | None = None
    spec_error: str | None = None
    pass_state: tuple[str, str] | None = None
    tip_known: bool = True


ROWS = [
    Row("applied spec is the tip's", rec(last_outcome=Outcome.SUCCESS), A1, H1, "in-sync"),
    Row("tip changed the spec", rec(last_outcome=Outcome.SUCCESS), A2, H1, "out-of-sync"),
    Row("not created yet", None, A1, None, "out-of-sync"),
    Row("suspended in Git, never started: apply has nothing to do", None, AS, None, "in-sync"),
    Row("suspended in Git after it ran: the suspend is still to do", rec(last_outcome=Outcome.SUCCESS), AS, H1,
        "out-of-sync"),
    Row("gone from the branch, prune off", rec(), None, H1, "out-of-sync"),
    Row("deleted, nothing applied", rec(), None, None, "in-sync"),
    Row("failed at the tip's spec", rec(last_outcome=Outcome.FAILURE, last_attempted_spec_hash=H2,
                                       last_message="rolled back: X"), A2, H1, "error"),
    Row("failed at an older spec, tip moved on", rec(last_outcome=Outcome.FAILURE, last_attempted_spec_hash=H1),
        A2, None, "out-of-sync"),
    Row("invalid spec at the tip", rec(), A1, H1, "error", spec_error="a.yaml:3: bad"),
    Row("unreadable record", None, A1, None, "blocked", broken="records/a.json: not JSON"),
    Row("the last pass blocked it", rec(), A2, H1, "blocked", pass_state=("blocked", "needs a person")),
    Row("job down in sync", rec(unhealthy_since=T), A1, H1, "recovering"),
    Row("no tip", rec(last_outcome=Outcome.SUCCESS), None, H1, "unknown", tip_known=False),
    Row("no tip, failed", rec(last_outcome=Outcome.FAILURE, last_message="x"), None, H1, "error", tip_known=False),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.why for r in ROWS])
def test_sync_state_table(row: Row) -> None:
    state, why = sync_state(record=row.record, broken=row.broken, inflight=None, tip_known=row.tip_known,
                            desired=row.desired, desired_hash=row.desired.app.spec_hash if row.desired else None,
                            applied_hash=row.applied_hash, spec_error=row.spec_error, pass_state=row.pass_state)
    assert state == row.expect, why
    assert why


def test_select_filters_sorts_counts_and_pages() -> None:
    rows = [AppRow(name=f"app-{i:03d}", namespace="ns-a" if i % 2 else "ns-b",
                   state="error" if i % 10 == 0 else "in-sync", why="") for i in range(250)]
    sel = select(rows, Query(per_page=100, page=3))
    assert (sel.total, sel.matched, sel.pages, sel.page, len(sel.rows)) == (250, 250, 3, 3, 50)
    assert sel.counts["error"] == 25 and sel.counts["in-sync"] == 225
    assert [r.name for r in select(rows, Query(q="APP-00", per_page=100)).rows] == [f"app-00{i}" for i in range(10)]
    errors = select(rows, Query(state="error", namespace="ns-b"))
    assert errors.matched == 25 and all(r.state == "error" for r in errors.rows)
    assert select(rows, Query(sort="state")).rows[0].state == "error"
    assert select(rows, Query(desc=True)).rows[0].name == "app-249"
    assert select(rows, Query(page=99)).page == 3  # past the end: the last page


@pytest.mark.parametrize(("url", "expect"), [
    ("https://github.com/acme/flink-apps.git", "https://github.com/acme/flink-apps/commit/"),
    ("git@github.com:acme/flink-apps.git", "https://github.com/acme/flink-apps/commit/"),
    ("https://x-access-token:ghp_secret@github.com/acme/apps", "https://github.com/acme/apps/commit/"),
    ("https://gitlab.com/group/sub/apps.git", "https://gitlab.com/group/sub/apps/-/commit/"),
    ("https://gitea.example.org/team/apps", "https://gitea.example.org/team/apps/commit/"),
    ("/srv/git/apps.git", None),
    ("https://example.org/team/apps", None),
])
def test_commit_links_name_the_forge_and_never_a_credential(url: str, expect: str | None) -> None:
    sha = "0123456789abcdef0123456789abcdef01234567"
    got = commit_url(url, sha)
    assert got == (expect + sha if expect else None)
    assert commit_url(url, "not a sha") is None


def test_secret_looking_configuration_values_are_masked() -> None:
    conf = {"s3.secret-key": "AKIA-long-secret", "fs.azure.account.key.x.blob": "k" * 20,
            "security.ssl.keystore-password": "pw-12345678", "state.checkpoints.num-retained": "3",
            "nested": {"password": "pw", "url": "https://user:tok3n-tok3n@host/x"}, "empty.token": ""}
    out = redact_config({"spec": {"flinkConfiguration": conf}})["spec"]["flinkConfiguration"]
    assert out["s3.secret-key"] == out["fs.azure.account.key.x.blob"] == REDACTED
    assert out["security.ssl.keystore-password"] == REDACTED
    assert out["state.checkpoints.num-retained"] == "3"
    assert out["nested"]["password"] == REDACTED and "tok3n" not in out["nested"]["url"]
    assert out["empty.token"] == ""  # nothing to hide; showing it empty tells the truth
    assert redact_config("value", "my.api-key") == REDACTED
    assert looks_secret("sasl.jaas.config") and not looks_secret("parallelism.default")
