"""What a FlinkDeployment of the Apache Flink Kubernetes Operator says, for a takeover (pure): may it be taken
over, and what its status says of the suspend we asked for.

The plan itself is `reconciler.core.takeover`'s (docs/migrate-from-flink-operator.md). Refused, with the reason,
while the operator is mid-upgrade or in error, when its job failed, or when its savepoints are not on durable
storage.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.core.observed import OperatorDeployment
from reconciler.operator_migration.application import RENAMED_KEYS, UnimportableError, flatten_configuration

SAVEPOINT_DIR = "execution.checkpointing.savepoint-dir"
# What the operator writes to status.jobStatus.upgradeSavepointPath after a last-state suspend: not a savepoint, a
# marker meaning "restore from the HA metadata", which deleting the FlinkDeployment deletes
# (AbstractJobReconciler.LAST_STATE_DUMMY_SP_PATH, used by ApplicationReconciler.deploy; operator 1.16-SNAPSHOT).
LAST_STATE_PLACEHOLDER = "KUBERNETES_OPERATOR_LAST_STATE"
# On (its default), a savepoint-mode suspend of a job that is not RUNNING falls back to last-state: no savepoint
# (AbstractJobReconciler.getJobUpgrade). Our suspend sets it "false": the operator then waits instead.
LAST_STATE_FALLBACK = "kubernetes.operator.job.upgrade.last-state-fallback.enabled"
_BUSY = {"UPGRADING", "ROLLING_BACK"}
_CHECKPOINT = re.compile(r"/chk-\d+/?$")  # a retained checkpoint (SnapshotObserver.observeLatestCheckpoint)


@dataclass(frozen=True)
class Before:
    """A FlinkDeployment as it was just before our suspend patch (journaled before the patch is sent): the
    savepoint fields of its status, to tell a savepoint this suspend produced from one that was already there,
    and every spec field the patch sets, to give it back as it was."""

    paths: tuple[str, ...] = ()  # every snapshot path its status named (upgradeSavepointPath, savepointInfo)
    last_time: int | None = None  # status.jobStatus.savepointInfo.lastSavepoint.timeStamp (epoch ms)
    job_state: str | None = None  # spec.job.state
    upgrade_mode: str | None = None  # spec.job.upgradeMode (None: unset)
    fallback: str | None = None  # spec.flinkConfiguration[LAST_STATE_FALLBACK] (None: unset)

    def to_json(self) -> str:
        return json.dumps({"paths": list(self.paths), "last_time": self.last_time, "job_state": self.job_state,
                           "upgrade_mode": self.upgrade_mode, "fallback": self.fallback}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Before:
        d = json.loads(text)
        return cls(paths=tuple(str(p) for p in d.get("paths") or ()), last_time=d.get("last_time"),
                   job_state=d.get("job_state"), upgrade_mode=d.get("upgrade_mode"), fallback=d.get("fallback"))


def before_suspend(deployment: Mapping[str, Any]) -> Before:
    """What `deployment` is now, before the suspend patch."""
    spec = _mapping(deployment.get("spec"))
    job = _mapping(spec.get("job"))
    conf = _mapping(spec.get("flinkConfiguration"))
    info = _mapping(_job_status(deployment).get("savepointInfo"))
    last = _mapping(info.get("lastSavepoint"))
    paths = [_job_status(deployment).get("upgradeSavepointPath"), last.get("location"),
             *(_mapping(h).get("location") for h in info.get("savepointHistory") or () if isinstance(h, Mapping))]
    stamp = last.get("timeStamp")
    return Before(paths=tuple(dict.fromkeys(str(p) for p in paths if p)),
                  last_time=int(stamp) if isinstance(stamp, int | float) and not isinstance(stamp, bool) else None,
                  job_state=_str(job.get("state")), upgrade_mode=_str(job.get("upgradeMode")),
                  fallback=_str(conf.get(LAST_STATE_FALLBACK)))


def suspend_patch() -> dict[str, Any]:
    """The merge patch that asks the operator to stop its job with a savepoint, and never without one."""
    return {"spec": {"job": {"state": "suspended", "upgradeMode": "savepoint"},
                     "flinkConfiguration": {LAST_STATE_FALLBACK: "false"}}}


def release_patch(before: Before) -> dict[str, Any]:
    """The merge patch that gives the FlinkDeployment back as it was: every field `suspend_patch` sets (null
    removes one that was unset)."""
    return {"spec": {"job": {"state": before.job_state or "running", "upgradeMode": before.upgrade_mode},
                     "flinkConfiguration": {LAST_STATE_FALLBACK: before.fallback}}}


@dataclass(frozen=True)
class Suspension:
    """What the operator's status says of a suspend we asked for."""

    done: bool
    savepoint: str | None  # the restore point, once done
    problem: str | None = None  # done without a usable savepoint: blocked, with this reason


def takeover_refusal(deployment: Mapping[str, Any], durable: Callable[[str], str | None]) -> str | None:
    """Why the FlinkDeployment must not be taken over now (None: it may). `durable(uri)` is the runtime's
    check of a storage location: None when it outlives the pods, else why not. Its job's state (RUNNING, or
    already suspended) is the planner's to judge (`core.takeover`): a spec naming the savepoint changes it."""
    name = _name(deployment)
    status = _mapping(deployment.get("status"))
    recon = _mapping(status.get("reconciliationStatus"))
    state = str(recon.get("state") or "")
    if state in _BUSY:
        return (f"FlinkDeployment {name} is mid-upgrade (reconciliationStatus.state {state}): wait until the "
                "operator has finished, then plan again")
    if status.get("error"):
        return (f"FlinkDeployment {name} is in error ({str(status['error'])[:200]}): fix it under the operator "
                "first; a takeover needs a savepoint the operator can take")
    spec = _mapping(deployment.get("spec"))
    try:
        conf = {k: v for k, (v, _) in flatten_configuration(spec.get("flinkConfiguration")).items()}
    except UnimportableError as e:
        return f"FlinkDeployment {name}: {e}"
    old = [k for k, new in RENAMED_KEYS.items() if SAVEPOINT_DIR in new]
    directory = conf.get(SAVEPOINT_DIR) or next((conf[k] for k in old if conf.get(k)), None)
    if not directory:
        return (f"FlinkDeployment {name} has no savepoint directory (execution.checkpointing.savepoint-dir): the "
                "operator could not take the savepoint the takeover starts from")
    why = durable(directory)
    if why:
        return f"FlinkDeployment {name}'s savepoint directory {directory!r} is not durable storage: {why}"
    return None


def suspend_refusal(deployment: Mapping[str, Any]) -> str | None:
    """Why our suspend must not be asked of `deployment` now (None: it may): it is suspended already (its status
    names an older savepoint, a checkpoint or the last-state placeholder, none of which this suspend produced),
    or its job is not RUNNING (no savepoint can be taken; the operator would fall back to last-state)."""
    name = _name(deployment)
    job = _mapping(_mapping(deployment.get("spec")).get("job"))
    lifecycle = str(_mapping(deployment.get("status")).get("lifecycleState") or "")
    if job.get("state") == "suspended" or lifecycle == "SUSPENDED":
        return (f"FlinkDeployment {name} is already suspended (spec.job.state {job.get('state')}, lifecycleState "
                f"{lifecycle or 'none'}): the savepoint its status names was not taken now and may be stale, a "
                f"checkpoint, or {LAST_STATE_PLACEHOLDER} (state kept only in HA metadata, which deleting it "
                "removes). Set spec.job.initialSavepointPath to the savepoint to start from (the newest complete "
                "one in its savepoint directory), or resume it under the operator (spec.job.state: running) so the "
                "takeover stops it with a new savepoint")
    flink = str(_job_status(deployment).get("state") or "")
    if flink != "RUNNING":
        return (f"FlinkDeployment {name}'s job is {flink or 'not reported'} (status.jobStatus.state), not RUNNING: "
                "the operator can take no savepoint of it (it would fall back to a last-state suspend without one). "
                "Plan again once it runs; a job that finished or failed for good: set spec.job.initialSavepointPath "
                "to its last savepoint, and suspend or delete it under the operator")
    return None


def suspension(deployment: Mapping[str, Any], before: Before,
               on_storage: Callable[[str], bool | None] = lambda _: None) -> Suspension:
    """Read the operator's status after our suspend patch, accepting only a savepoint this suspend produced: a
    path its status did not name before, not a checkpoint nor the last-state placeholder, newer than the last
    savepoint it recorded, and (when `on_storage(path)` can look: True/False, None when it cannot) with its
    `_metadata` on storage. Anything else is a problem: the FlinkDeployment is then given back, never deleted."""
    status = _mapping(deployment.get("status"))
    if str(status.get("lifecycleState") or "") != "SUSPENDED":
        if status.get("error"):
            return Suspension(True, None, f"the operator reported an error while suspending: "
                                          f"{str(status['error'])[:200]}; the job is left to the operator")
        return Suspension(False, None)
    path = _str(_job_status(deployment).get("upgradeSavepointPath"))
    why = _not_produced(deployment, path, before, on_storage)
    if why:
        return Suspension(True, None, f"{why}; it is not deleted, and the takeover does not start from it")
    return Suspension(True, path)


def _not_produced(deployment: Mapping[str, Any], path: str | None, before: Before,
                  on_storage: Callable[[str], bool | None]) -> str | None:
    if not path:
        return ("the operator suspended the job without a savepoint path in status.jobStatus.upgradeSavepointPath "
                "(a stateless or failed suspend)")
    if path == LAST_STATE_PLACEHOLDER:
        return (f"the operator suspended the job without a savepoint ({LAST_STATE_PLACEHOLDER}: a last-state "
                "suspend, its state only in HA metadata)")
    if _CHECKPOINT.search(path):
        return f"the operator suspended the job from a checkpoint ({path}), not with a savepoint"
    if path in before.paths:
        return (f"the operator's status still names {path}, a savepoint it named before this suspend: this suspend "
                "produced none")
    last = _mapping(_mapping(_job_status(deployment).get("savepointInfo")).get("lastSavepoint"))
    stamp = last.get("timeStamp")
    if last.get("location") == path and before.last_time is not None and isinstance(stamp, int | float) \
            and not isinstance(stamp, bool) and stamp <= before.last_time:
        return f"the savepoint {path} is not newer than the last one the operator recorded before this suspend"
    if on_storage(path) is False:
        return f"the savepoint {path} has no _metadata on storage (incomplete or removed)"
    return None


def _name(deployment: Mapping[str, Any]) -> str:
    meta = deployment.get("metadata") if isinstance(deployment.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"


def operator_view(deployment: Mapping[str, Any], durable: Callable[[str], str | None]) -> OperatorDeployment:
    """What the planner needs of an observed FlinkDeployment."""
    meta = _mapping(deployment.get("metadata"))
    job = _mapping(_mapping(deployment.get("spec")).get("job"))
    status = _mapping(deployment.get("status"))
    return OperatorDeployment(
        namespace=str(meta.get("namespace") or "default"), name=str(meta.get("name") or "?"),
        job_state=str(job["state"]) if job.get("state") else None,
        upgrade_mode=str(job["upgradeMode"]) if job.get("upgradeMode") else None,
        lifecycle=str(status["lifecycleState"]) if status.get("lifecycleState") else None,
        fallback=_str(_mapping(_mapping(deployment.get("spec")).get("flinkConfiguration")).get(LAST_STATE_FALLBACK)),
        refusal=takeover_refusal(deployment, durable),
        not_suspendable=suspend_refusal(deployment),
    )


def wanted_deployment(app_name: str, namespace: str, takeover_from: str | None) -> tuple[str, str]:
    """(namespace, name) of the FlinkDeployment an app would take over: spec.takeover's, else its own name."""
    return namespace, (takeover_from.partition("/")[2] if takeover_from else app_name)


def _mapping(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _job_status(deployment: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(_mapping(deployment.get("status")).get("jobStatus"))


def _str(v: Any) -> str | None:
    return None if v is None or v == "" else str(v)
