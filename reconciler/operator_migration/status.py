"""What a FlinkDeployment of the Apache Flink Kubernetes Operator says, for a takeover (pure): may it be taken
over, and what its status says of the suspend we asked for.

The plan itself is `reconciler.core.takeover`'s (docs/migrate-from-flink-operator.md). Refused, with the reason,
while the operator is mid-upgrade or in error, when its job failed, or when its savepoints are not on durable
storage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.core.observed import OperatorDeployment
from reconciler.operator_migration.application import RENAMED_KEYS, UnimportableError, flatten_configuration

SAVEPOINT_DIR = "execution.checkpointing.savepoint-dir"
_BUSY = {"UPGRADING", "ROLLING_BACK"}
_JOB_ERROR = {"FAILED", "FAILING", "RESTARTING"}


@dataclass(frozen=True)
class Suspension:
    """What the operator's status says of a suspend we asked for."""

    done: bool
    savepoint: str | None  # the restore point, once done
    problem: str | None = None  # done without a usable savepoint: blocked, with this reason


def takeover_refusal(deployment: Mapping[str, Any], durable: Callable[[str], str | None]) -> str | None:
    """Why the FlinkDeployment must not be taken over now (None: it may). `durable(uri)` is the runtime's
    check of a storage location: None when it outlives the pods, else why not."""
    name = _name(deployment)
    status = deployment.get("status") if isinstance(deployment.get("status"), Mapping) else {}
    assert isinstance(status, Mapping)
    recon = status.get("reconciliationStatus") if isinstance(status.get("reconciliationStatus"), Mapping) else {}
    assert isinstance(recon, Mapping)
    job_status = status.get("jobStatus") if isinstance(status.get("jobStatus"), Mapping) else {}
    assert isinstance(job_status, Mapping)
    state = str(recon.get("state") or "")
    if state in _BUSY:
        return (f"FlinkDeployment {name} is mid-upgrade (reconciliationStatus.state {state}): wait until the "
                "operator has finished, then plan again")
    if status.get("error"):
        return (f"FlinkDeployment {name} is in error ({str(status['error'])[:200]}): fix it under the operator "
                "first; a takeover needs a savepoint the operator can take")
    job_state = str(job_status.get("state") or "")
    if job_state in _JOB_ERROR:
        return f"FlinkDeployment {name}'s job is {job_state}: a takeover needs a running job that can take a savepoint"
    spec = deployment.get("spec") if isinstance(deployment.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
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


def suspension(deployment: Mapping[str, Any]) -> Suspension:
    """Read the operator's status after we set spec.job.state: suspended with upgradeMode savepoint."""
    status = deployment.get("status") if isinstance(deployment.get("status"), Mapping) else {}
    assert isinstance(status, Mapping)
    job_status = status.get("jobStatus") if isinstance(status.get("jobStatus"), Mapping) else {}
    assert isinstance(job_status, Mapping)
    if str(status.get("lifecycleState") or "") != "SUSPENDED":
        if status.get("error"):
            return Suspension(True, None, f"the operator reported an error while suspending: "
                                          f"{str(status['error'])[:200]}; the job is left to the operator")
        return Suspension(False, None)
    path = job_status.get("upgradeSavepointPath")
    if not path:
        return Suspension(True, None, "the operator suspended the job without a savepoint path in "
                                      "status.jobStatus.upgradeSavepointPath: restore by hand (never from empty)")
    return Suspension(True, str(path))


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
        refusal=takeover_refusal(deployment, durable),
    )


def wanted_deployment(app_name: str, namespace: str, takeover_from: str | None) -> tuple[str, str]:
    """(namespace, name) of the FlinkDeployment an app would take over: spec.takeover's, else its own name."""
    return namespace, (takeover_from.partition("/")[2] if takeover_from else app_name)


def _mapping(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}
