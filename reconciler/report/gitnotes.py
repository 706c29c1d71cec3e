"""Statuses as git notes on the commit, pushed to origin: works with any Git server, no API token.

One note per commit under refs/notes/flink-reconciler, one line per app, and for an execution that
started a job or took a savepoint a structured lineage line (a second durable copy of where each app's
state went, that any clone can read: a reconciler that lost its records recovers from it):

    flink-reconciler/orders: success - upgrade applied at 1a2b3c4d5e6f; job 9f... running
    flink-reconciler-lineage/orders: {"at": "...", "restored_from": "file:/sp/savepoint-1", "savepoints": [...], ...}

Sharded daemons write each app's lines under its shard's own ref (`refs/notes/flink-reconciler-shard-<i>`):
writers of one ref fetch, merge and retry when another pushed first, so five shards sharing a ref spent
seconds re-merging a 50,000-line note after each lost race; with a ref each they never race one another.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from reconciler.errors import ReportError, SourceAuthError, SourceError, TransientReportError
from reconciler.redaction import redact_urls
from reconciler.report.status import LINEAGE_PREFIX, CommitStatus, one_line
from reconciler.source.git import NOTES_REF, GitSource


def note_line(status: CommitStatus) -> str:
    """The app's line of the note; a note is pushed to origin, so URL credentials in a message are masked."""
    line = f"{status.context}: {status.state.value} - {status.one_line_description()}"
    if status.target_url:
        line += f" ({one_line(status.target_url)})"
    return redact_urls(line)


def shard_notes_ref(index: int, ref: str = NOTES_REF) -> str:
    """The notes ref of shard `index` (GitSource.read_notes reads `ref` and these together)."""
    return f"{ref}-shard-{index}"


class GitNotesSink:
    name = "git-notes"

    def __init__(self, source: GitSource, *, ref: str = NOTES_REF, push: bool = True,
                 ref_for: Callable[[str], str] | None = None) -> None:
        """`ref_for`: the ref of an app's lines (a sharded daemon's: its shard's ref), else `ref`."""
        self._source = source
        self._ref = ref
        self._push = push
        self._ref_for = ref_for

    def __repr__(self) -> str:
        return f"GitNotesSink({self._source.url} {self._ref})"

    def post(self, status: CommitStatus) -> None:
        self.post_batch([status])

    def post_batch(self, statuses: Sequence[CommitStatus]) -> None:
        """Write every line locally, then push once per ref."""
        by_ref: dict[str, dict[str, dict[str, str]]] = {}
        for status in statuses:  # later statuses of the same app win, as they would one by one
            ref = self._ref if self._ref_for is None else self._ref_for(status.app)
            lines = by_ref.setdefault(ref, {}).setdefault(status.revision, {})
            lines[status.context] = note_line(status)
            if status.has_lineage:
                lineage = f"{LINEAGE_PREFIX}{status.app}: {status.lineage_json()}"
                lines[LINEAGE_PREFIX + status.app] = redact_urls(lineage)
        try:
            for ref, by_revision in by_ref.items():
                for revision, lines in by_revision.items():
                    self._source.add_notes(revision, lines, ref=ref)
        except SourceError as e:  # e.g. a commit we never fetched: retrying will not make it appear
            raise ReportError(f"git notes: {e}") from None
        if not self._push:
            return
        failed: list[str] = []
        for ref in by_ref:  # one ref that cannot be pushed does not hold back the others' lines
            try:
                self._source.push_notes(ref)
            except SourceAuthError as e:
                raise ReportError(f"git notes: {e}") from None
            except SourceError as e:  # unreachable, or raced another writer too often
                failed.append(str(e))
        if failed:
            raise TransientReportError(f"git notes: {'; '.join(failed)}")
