from __future__ import annotations

from typing import Any

import pytest

from reconciler.core.diff import class_of, diff, highest_class
from reconciler.spec.model import ChangeClass
from tests.core.builders import app, with_meta


@pytest.mark.parametrize(
    ("pointer", "expected"),
    [
        ("/metadata/labels/team", ChangeClass.IGNORE),
        ("/metadata/namespace", ChangeClass.REDEPLOY),
        ("/spec/taskManager/replicas", ChangeClass.SCALE),
        ("/spec/taskManager/slots", ChangeClass.UPGRADE),
        ("/spec/taskManager/resources/memory", ChangeClass.UPGRADE),
        ("/spec/taskManager/volumeClaimTemplates/0/storage", ChangeClass.REDEPLOY),
        ("/spec/job/parallelism", ChangeClass.UPGRADE),
        ("/spec/job/args/1", ChangeClass.UPGRADE),
        ("/spec/job/upgradeMode", ChangeClass.IGNORE),
        ("/spec/job/maxCheckpointAge", ChangeClass.IGNORE),
        ("/spec/flinkConfiguration/state.backend.type", ChangeClass.UPGRADE),
        ("/spec/flinkConfiguration/a~1b", ChangeClass.UPGRADE),
        ("/spec/podTemplate/spec/containers/0/env", ChangeClass.UPGRADE),
        ("/spec/highAvailability/enabled", ChangeClass.REDEPLOY),
        ("/spec/deletionPolicy", ChangeClass.IGNORE),
        ("/spec/deadlines/start", ChangeClass.IGNORE),
    ],
)
def test_every_field_has_its_change_class(pointer: str, expected: ChangeClass) -> None:
    assert class_of(pointer) is expected


def test_field_diff_is_json_patch_with_old_and_new_values() -> None:
    old = app(job={"parallelism": 1, "args": ["a"]}).canonical()
    new = with_meta(app(job={"parallelism": 2, "args": ["a", "b"]}), labels={"x": "y"}).canonical()
    changes = diff(old, new)
    assert [(c.op, c.path, c.old, c.new, c.change_class) for c in changes] == [
        ("add", "/metadata/labels/x", None, "y", ChangeClass.IGNORE),
        ("add", "/spec/job/args/1", None, "b", ChangeClass.UPGRADE),
        ("replace", "/spec/job/parallelism", 1, 2, ChangeClass.UPGRADE),
    ]
    assert highest_class(changes) is ChangeClass.UPGRADE


def test_no_previous_means_no_field_diff_and_equal_is_empty() -> None:
    a = app().canonical()
    assert diff(None, a) == ()
    assert diff(a, a) == ()
    assert highest_class(()) is ChangeClass.IGNORE


def test_removed_field_reports_the_old_value() -> None:
    old = app(flinkConfiguration={"a": "1", "b": "2"}).canonical()
    new = app(flinkConfiguration={"a": "1"}).canonical()
    (change,) = diff(old, new)
    assert (change.op, change.path, change.old, change.new) == ("remove", "/spec/flinkConfiguration/b", "2", None)


@pytest.mark.parametrize(
    ("state", "running", "total", "finished", "phase"),
    [
        ("RUNNING", 4, 4, 0, "running"),
        ("RUNNING", 3, 4, 1, "running"),  # a source subtask without splits finished: seen on Flink 2.3
        ("RUNNING", 3, 4, 0, "starting"),  # RUNNING before every task runs
        ("RUNNING", 0, 4, 4, "starting"),
        ("RESTARTING", 0, 4, 0, "starting"),
        ("FAILED", 0, 4, 0, "failing"),
        ("CANCELED", 0, 4, 0, "stopped"),
        (None, 0, 0, 0, "none"),
        ("WEIRD", 0, 0, 0, "unknown"),
    ],
)
def test_job_phase(state: str | None, running: int, total: int, finished: int, phase: str) -> None:
    from reconciler.core.observed import job_phase

    assert job_phase(state, running, total, finished).value == phase


def test_spec_hash_is_one_function_of_spec_only() -> None:
    """The journal hashes a plan's dict, the planner the model: they must agree, or a failed spec is retried."""
    from reconciler.core.plan import spec_hash

    a = app(job={"parallelism": 2})
    assert spec_hash(a.canonical()) == a.spec_hash
    assert with_meta(a, labels={"x": "y"}).spec_hash == a.spec_hash
    assert app(job={"parallelism": 3}).spec_hash != a.spec_hash


_ENV = {"spec": {"containers": [{"name": "flink-main-container", "env": [
    {"name": "AWS_SECRET_ACCESS_KEY", "value": "old-secret-value"}, {"name": "LOG_LEVEL", "value": "INFO"}]}]}}


@pytest.mark.parametrize(("old_spec", "new_spec", "expected"), [
    # a secret flinkConfiguration value, changed, added, removed: the key shows, the value never does
    ({"flinkConfiguration": {"s3.secret-key": "hunter2"}}, {"flinkConfiguration": {"s3.secret-key": "hunter3"}},
     [("replace", "/spec/flinkConfiguration/s3.secret-key", "***", "***")]),
    ({}, {"flinkConfiguration": {"fs.azure.account.key.acct.blob.core.windows.net": "k3y"}},
     [("add", "/spec/flinkConfiguration/fs.azure.account.key.acct.blob.core.windows.net", None, "***")]),
    ({"flinkConfiguration": {"a": "1", "security.ssl.rest.keystore-password": "pw"}},
     {"flinkConfiguration": {"a": "1"}},
     [("remove", "/spec/flinkConfiguration/security.ssl.rest.keystore-password", "***", None)]),
    # an env entry whose name looks secret: its value is masked, its neighbours are not
    ({"podTemplate": _ENV}, {"podTemplate": {"spec": {"containers": [{"name": "flink-main-container", "env": [
        {"name": "AWS_SECRET_ACCESS_KEY", "value": "new-secret-value"}, {"name": "LOG_LEVEL", "value": "DEBUG"}]}]}}},
     [("replace", "/spec/podTemplate/spec/containers/0/env/0/value", "***", "***"),
      ("replace", "/spec/podTemplate/spec/containers/0/env/1/value", "INFO", "DEBUG")]),
    ({}, {"podTemplate": _ENV},
     [("replace", "/spec/podTemplate", None, {"spec": {"containers": [{"name": "flink-main-container", "env": [
         {"name": "AWS_SECRET_ACCESS_KEY", "value": "***"}, {"name": "LOG_LEVEL", "value": "INFO"}]}]}})]),
    # an ordinary key keeps its values
    ({"flinkConfiguration": {"parallelism.default": "1"}}, {"flinkConfiguration": {"parallelism.default": "2"}},
     [("replace", "/spec/flinkConfiguration/parallelism.default", "1", "2")]),
])
def test_a_diff_never_shows_a_secret_value(old_spec: dict[str, Any], new_spec: dict[str, Any],
                                           expected: list[tuple[str, str, object, object]]) -> None:
    """A plan is posted on pull requests and kept in notes: masked like the logs and the dashboard."""
    changes = diff(app(**old_spec).canonical(), app(**new_spec).canonical())
    assert [(c.op, c.path, c.old, c.new) for c in changes] == expected
    assert "secret-value" not in str([c.model_dump() for c in changes]) and "hunter" not in str(changes)
