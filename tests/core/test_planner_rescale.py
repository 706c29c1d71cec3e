"""Issue 11 item 2: in-place rescale (opt-in, Flink's adaptive scheduler), the spec and the planner's rows."""

from __future__ import annotations

from reconciler.spec.load import load_files

SPEC = """\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: a
spec:
  taskManager: {{replicas: 1, slots: 4}}
  flinkConfiguration:
    execution.checkpointing.interval: 1 s
{scheduler}  upgrade:
    inPlaceRescale: true
  job:
    jarURI: jobs/counter.jar
"""


def test_in_place_rescale_without_the_adaptive_scheduler_is_an_error_at_its_line() -> None:
    text = SPEC.format(scheduler="")
    (err,) = load_files({"apps/a.yaml": text.encode()}).errors
    assert (err.file, err.line, err.field, err.app) == ("apps/a.yaml", 9, "spec.upgrade", "a")
    assert "inPlaceRescale needs Flink's adaptive scheduler" in err.message
    assert "jobmanager.scheduler: adaptive" in err.message


def test_in_place_rescale_with_the_adaptive_scheduler_loads() -> None:
    text = SPEC.format(scheduler="    jobmanager.scheduler: Adaptive\n")
    result = load_files({"apps/a.yaml": text.encode()})
    assert not result.errors
    assert result.apps["a"].app.spec.upgrade.in_place_rescale
