"""Issue 11 item 2 on real Flink: a parallelism-only change with `upgrade.inPlaceRescale` keeps the same job.

One local cluster for the module (1 JobManager with the adaptive scheduler, 1 TaskManager with 2 slots),
the counter job committed to a Git repository and applied with the CLI. In order:

1. parallelism 1 -> 2, in place: the plan says `scale` with RescaleInPlace first; after `apply` the same
   job id is the only job, RUNNING, its vertices report parallelism 2 (`GET /jobs/<id>`), it restored from
   its OWN latest checkpoint (Flink 2.3's adaptive scheduler restarts the tasks from it: `latest.restored`
   is a checkpoint of this job, `is_savepoint: false`, never a savepoint), no savepoint was taken, the
   counts continue, and the record says parallelism 2.
2. parallelism 2 -> 1 right after, with `deadlines.rescale: 3s`: the scheduler's cooldown after the last
   rescale (15 s here) keeps it from adopting in time, so the executor journals the fallback and runs the
   savepoint upgrade: a new job at parallelism 1, restored from the savepoint, counts continuing.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.cli import main
from reconciler.clock import SystemClock
from reconciler.live.local.runtime import LocalRuntime
from tests.fixtures.flink import COUNTER_MAIN, read_counts, teardown_runtime, wait_until
from tests.gitutil import Repo

pytestmark = [pytest.mark.flink, pytest.mark.slow]

APP = "rescale"
KEYS = 4
COOLDOWN = "15 s"  # the adaptive scheduler's cooldown after a (re)start: short enough for test 1, long for 2


def app_yaml(parallelism: int, rescale_deadline: str = "90s") -> str:
    return f"""\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {APP}
spec:
  taskManager:
    replicas: 1
    slots: 2
  flinkConfiguration:
    execution.checkpointing.interval: 1 s
    jobmanager.scheduler: adaptive
    jobmanager.adaptive-scheduler.executing.cooldown-after-rescaling: {COOLDOWN}
  upgrade:
    inPlaceRescale: true
  job:
    jarURI: jobs/counter/counter.jar
    entryClass: {COUNTER_MAIN}
    args: ["--output-dir", "out", "--keys", "{KEYS}", "--rate", "100"]
    parallelism: {parallelism}
  deadlines:
    savepoint: 60s
    start: 90s
    healthy: 30s
    rescale: {rescale_deadline}
"""


@dataclass
class Env:
    repo: Repo
    state: Path
    rt: LocalRuntime

    def cli(self, *args: str) -> tuple[int, str]:
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            code = main(list(args))
        return code, buf.getvalue()

    def commit(self, message: str, **kw: Any) -> str:
        self.repo.write("apps/rescale.yaml", app_yaml(**kw))
        return self.repo.commit(message)

    def apply(self) -> tuple[int, str]:
        return self.cli("apply", "--repo", str(self.repo.work), "--state-dir", str(self.state))

    def plan(self) -> dict[str, Any]:
        code, out = self.cli("plan", "--repo", str(self.repo.work), "--live", "--state-dir", str(self.state),
                             "--format", "json")
        assert code == 0, out
        (app,) = json.loads(out)["apps"]
        assert isinstance(app, dict)
        return app

    def record(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads((self.state / "records" / f"{APP}.json").read_text())
        return doc

    def rest(self, path: str) -> Any:
        info = self.rt.observe(APP)
        assert info.rest_url
        return httpx.get(info.rest_url + path, timeout=10).json()

    def only_job(self) -> str:
        def probe() -> str | None:
            live = [j for j in self.rt.flink(APP).jobs() if j.state not in ("FINISHED", "CANCELED", "FAILED")]
            if len(live) == 1 and live[0].state == "RUNNING" and live[0].tasks_running > 0 and (
                    live[0].tasks_running + live[0].tasks_finished == live[0].tasks_total):
                return live[0].job_id
            return None
        return wait_until(probe, timeout=30, interval=0.2, what="exactly one job with all tasks RUNNING")

    def counts(self) -> dict[str, int]:
        return read_counts(self.rt.paths(APP).work / "out")

    def counts_grow_from(self, before: dict[str, int]) -> dict[str, int]:
        """Every key's count moves past `before` and none ever reads below it (a reset would)."""
        def probe() -> dict[str, int] | None:
            now = self.counts()
            low = {k: (before[k], now.get(k)) for k in before if now.get(k, before[k]) < before[k]}
            assert not low, f"counts went below their values before the change (before, now): {low}"
            return now if all(now.get(k, -1) > before[k] for k in before) else None
        return wait_until(probe, timeout=30, interval=0.05, what=f"every count to move past {before}")


@pytest.fixture(scope="module")
def env(counter_jar: Path, flink_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    repo = Repo(tmp_path_factory.mktemp("rescale"))
    state = repo.origin.parent / "state"
    e = Env(repo, state, LocalRuntime(state, clock=SystemClock(), flink_home=flink_home))
    repo.write("jobs/counter/counter.jar", counter_jar.read_bytes())
    e.commit("counter app, adaptive scheduler, in-place rescale on", parallelism=1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLINK_HOME", str(flink_home))
        try:
            code, out = e.apply()
            assert code == 0, f"creating the app failed:\n{out}"
            wait_until(lambda: len(e.counts()) == KEYS, timeout=30, what="the counter to write every key")
            yield e
        finally:
            teardown_runtime(e.rt)


def test_a_parallelism_change_keeps_the_same_job_running_at_the_new_parallelism(env: Env) -> None:
    job = env.only_job()
    rev = env.commit("parallelism 1 -> 2", parallelism=2)
    plan = env.plan()
    assert plan["action"] == "scale", plan["reason"]
    assert [s["type"] for s in plan["steps"]][:2] == ["RescaleInPlace", "StopWithSavepoint"]
    assert plan["steps"][0] | {"deadline_s": 0} == {"type": "RescaleInPlace", "job_id": job, "parallelism": 2,
                                                     "previous_parallelism": 1, "deadline_s": 0}
    assert "rescaled in place by the adaptive scheduler" in plan["reason"]
    before = env.counts()

    code, out = env.apply()

    assert code == 0, out
    assert env.only_job() == job, "the same job keeps running: no new job"
    assert [j.job_id for j in env.rt.flink(APP).jobs()] == [job], "and no other job was ever started"
    detail = wait_until(lambda: (d := env.rest(f"/jobs/{job}")) and all(v["parallelism"] == 2 for v in d["vertices"])
                        and d, timeout=10, what="GET /jobs/<id> to report parallelism 2")
    assert detail["state"] == "RUNNING" and len(detail["vertices"]) == 2
    restored = env.rest(f"/jobs/{job}/checkpoints")["latest"]["restored"]
    # What Flink 2.3 does: the rescale restarts the tasks from the job's own latest checkpoint.
    assert restored["is_savepoint"] is False and f"/{job}/chk-" in restored["external_path"], restored
    env.counts_grow_from(before)
    doc = env.record()
    assert doc["record"]["last_applied_revision"] == rev and doc["record"]["job_id"] == job
    assert doc["record"]["last_applied_spec"]["spec"]["job"]["parallelism"] == 2
    assert not [s for s in doc["savepoints"] if s.get("revision") == rev], "no savepoint was taken"
    assert not [t for t in doc["transitions"] if t["action"] == "fallback"]
    assert doc["lineage"][-1]["job_id"] == job and doc["lineage"][-1]["restored_from"] is None


def test_a_rescale_flink_does_not_adopt_in_time_falls_back_to_the_savepoint_upgrade(env: Env) -> None:
    job = env.only_job()
    rev = env.commit("parallelism 2 -> 1, rescale deadline shorter than the cooldown", parallelism=1,
                     rescale_deadline="3s")
    assert env.plan()["action"] == "scale"
    before = env.counts()

    code, out = env.apply()

    assert code == 0, out
    new = env.only_job()
    assert new != job, "the fallback replaced the job"
    detail = env.rest(f"/jobs/{new}")
    assert [v["parallelism"] for v in detail["vertices"]] == [1, 1]
    restored = env.rest(f"/jobs/{new}/checkpoints")["latest"]["restored"]
    assert restored["is_savepoint"] is True, restored
    env.counts_grow_from(before)
    doc = env.record()
    fallback = [t for t in doc["transitions"] if t["action"] == "fallback" and t["revision"] == rev]
    assert len(fallback) == 1 and "deadline passed waiting for job" in fallback[0]["message"], fallback
    assert doc["record"]["last_applied_spec"]["spec"]["job"]["parallelism"] == 1
    assert [s["path"] for s in doc["savepoints"] if s.get("revision") == rev] == [restored["external_path"]]
