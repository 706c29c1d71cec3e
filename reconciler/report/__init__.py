"""Commit statuses: what happened to each app at each commit, told back to Git and the forges."""

from reconciler.report.gitea import GiteaStatusSink
from reconciler.report.github import GitHubStatusSink
from reconciler.report.gitlab import GitLabStatusSink
from reconciler.report.gitnotes import GitNotesSink, note_line
from reconciler.report.reporter import Reporter, RetryPolicy, SinkStats
from reconciler.report.status import BatchStatusSink, CommitStatus, StatusSink

__all__ = [
    "BatchStatusSink",
    "CommitStatus",
    "GitHubStatusSink",
    "GitLabStatusSink",
    "GitNotesSink",
    "GiteaStatusSink",
    "Reporter",
    "RetryPolicy",
    "SinkStats",
    "StatusSink",
    "note_line",
]
