"""Property: import(FlinkDeployment) then our Kubernetes render gives the pods what the operator would give them.

The oracle below is written from the operator's FlinkConfigBuilder (not from the mapping under test): memory
requests become the process size (Flink's MemorySize syntax first, else a Kubernetes quantity), cpu requests
the cpu, `taskManager.replicas` overrides the job's parallelism (replicas x slots), otherwise Flink asks for
ceil(parallelism / slots) TaskManagers, the user's configuration is kept (1.x keys under their 2.x names),
the job name defaults to the resource name, and the job's entry class and arguments reach the program.
"""

from __future__ import annotations

import math
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.live.kubernetes.render import render_app
from reconciler.operator_migration.documents import import_document
from reconciler.spec.model import FlinkApp

MIB = 1 << 20
# Plain user options (the operator passes them through); some spelled the Flink 1.x way.
USER_KEYS = {
    "execution.checkpointing.interval": st.sampled_from(["10s", "1 min", "30000"]),
    "restart-strategy.type": st.sampled_from(["fixed-delay", "exponential-delay"]),
    "state.backend.type": st.sampled_from(["hashmap", "rocksdb"]),
    "pipeline.max-parallelism": st.integers(1, 4096),
    "execution.checkpointing.savepoint-dir": st.just("s3://bucket/savepoints"),
    "execution.checkpointing.dir": st.just("s3://bucket/checkpoints"),
    "table.exec.source.idle-timeout": st.just("5 s"),
}
OLD_NAMES = {"state.savepoints.dir": "execution.checkpointing.savepoint-dir",
             "state.checkpoints.dir": "execution.checkpointing.dir", "state.backend": "state.backend.type"}


def memory_strategy() -> st.SearchStrategy[tuple[str, int]]:
    """(text, bytes the operator reads) in the forms people write."""
    mib = st.integers(256, 16384)
    return st.one_of(
        mib.map(lambda n: (f"{n}m", n * MIB)),
        st.integers(1, 16).map(lambda n: (f"{n}g", n << 30)),
        st.integers(1, 16).map(lambda n: (f"{n}Gi", n << 30)),
        mib.map(lambda n: (f"{n}Mi", n * MIB)),
    )


def cpu_strategy() -> st.SearchStrategy[tuple[Any, float]]:
    return st.one_of(st.sampled_from([(0.5, 0.5), (1, 1.0), (2, 2.0), ("250m", 0.25), ("1500m", 1.5)]))


def nest(conf: dict[str, Any]) -> dict[str, Any]:
    """The nested YAML form of some keys: `a.b.c: v` -> `a: {b.c: v}`."""
    out: dict[str, Any] = {}
    for k, v in conf.items():
        head, _, rest = k.partition(".")
        if rest and head not in conf and not isinstance(out.get(head), str):
            out.setdefault(head, {})[rest] = v
        else:
            out[k] = v
    return out


@st.composite
def deployments(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """(FlinkDeployment, what the operator gives its pods)."""
    slots = draw(st.integers(1, 4))
    parallelism = draw(st.integers(1, 12))
    tm_replicas = draw(st.one_of(st.none(), st.integers(1, 4)))
    jm_mem, jm_bytes = draw(memory_strategy())
    tm_mem, tm_bytes = draw(memory_strategy())
    jm_cpu, jm_cores = draw(cpu_strategy())
    tm_cpu, tm_cores = draw(cpu_strategy())
    new_form = draw(st.booleans())
    user = draw(st.dictionaries(st.sampled_from(sorted(USER_KEYS)), st.just(None), max_size=4))
    conf: dict[str, Any] = {k: draw(USER_KEYS[k]) for k in user}
    for old, new in OLD_NAMES.items():
        if new in conf and draw(st.booleans()):
            conf[old] = conf.pop(new)
    conf["taskmanager.numberOfTaskSlots"] = slots
    stateful = draw(st.booleans())
    if stateful:
        conf.update({"high-availability.type": "kubernetes", "high-availability.storageDir": "s3://bucket/ha"})
        conf.setdefault("execution.checkpointing.savepoint-dir", "s3://bucket/sp")
        conf.setdefault("execution.checkpointing.dir", "s3://bucket/cp")
        for old, new in OLD_NAMES.items():
            if old in conf:
                conf.pop(new, None)
    entry = draw(st.one_of(st.none(), st.just("org.example.Main")))
    args = draw(st.lists(st.one_of(st.text("abc-=09", min_size=1, max_size=6), st.integers(0, 99)), max_size=3))

    def component(mem: str, cpu: Any) -> dict[str, Any]:
        if new_form:
            return {"resources": {"requests": {"memory": mem, "cpu": cpu}}}
        return {"resource": {"memory": mem, "cpu": cpu}}

    tm = component(tm_mem, tm_cpu)
    if tm_replicas is not None:
        tm["replicas"] = tm_replicas
    job: dict[str, Any] = {"jarURI": "local:///opt/flink/usrlib/job.jar", "parallelism": parallelism,
                           "upgradeMode": "savepoint" if stateful else "stateless", "args": args}
    if entry:
        job["entryClass"] = entry
    doc: dict[str, Any] = {"apiVersion": "flink.apache.org/v1beta1", "kind": "FlinkDeployment",
           "metadata": {"name": "prop-app", "namespace": "ns"},
           "spec": {"image": draw(st.sampled_from(["flink:2.2", "registry.example/jobs/app:1.4"])),
                    "flinkVersion": "v2_2",
                    "flinkConfiguration": nest(conf) if draw(st.booleans()) else conf,
                    "jobManager": component(jm_mem, jm_cpu), "taskManager": tm, "job": job}}
    # --- the operator's pods, by its rules -------------------------------------------------------------
    effective_parallelism = tm_replicas * slots if tm_replicas is not None else parallelism
    user_conf: dict[str, str] = {OLD_NAMES.get(k, k): str(v) for k, v in conf.items()
                 if not k.startswith("high-availability") and k != "taskmanager.numberOfTaskSlots"}
    expected: dict[str, Any] = {
        "image": doc["spec"]["image"],
        "jm_process_mib": jm_bytes // MIB, "tm_process_mib": tm_bytes // MIB,
        "jm_cpu": jm_cores, "tm_cpu": tm_cores,
        "taskmanagers": tm_replicas if tm_replicas is not None else math.ceil(parallelism / slots),
        "slots": slots, "parallelism": effective_parallelism,
        "config": {**user_conf, "pipeline.name": "prop-app"},
        "entry": entry, "args": [str(a) for a in args], "ha": stateful,
    }
    return doc, expected


def cores(q: str) -> float:
    return int(q[:-1]) / 1000 if q.endswith("m") else float(q)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deployments())
def test_import_then_render_gives_the_operator_s_pods(case: tuple[dict[str, Any], dict[str, Any]]) -> None:
    doc, exp = case
    imp = import_document(doc)
    assert imp.app is not None and not imp.changes_behaviour, imp.findings
    app = FlinkApp.model_validate(imp.app)
    objs = {(o["kind"], o["metadata"]["name"]): o for o in
            render_app(app, revision="r", job_id="0" * 32, restore_path=None)}
    conf = yaml.safe_load(objs[("ConfigMap", "prop-app-config")]["data"]["config.yaml"])
    conf = {k: str(v) for k, v in conf.items()}
    jm = objs[("Deployment", "prop-app-jobmanager")]["spec"]["template"]["spec"]["containers"][0]
    tm_dep = objs[("Deployment", "prop-app-taskmanager")]
    tm = tm_dep["spec"]["template"]["spec"]["containers"][0]
    assert jm["image"] == tm["image"] == exp["image"]
    assert conf["jobmanager.memory.process.size"] == f"{exp['jm_process_mib']}m"
    assert conf["taskmanager.memory.process.size"] == f"{exp['tm_process_mib']}m"
    assert cores(jm["resources"]["requests"]["cpu"]) == exp["jm_cpu"]
    assert cores(tm["resources"]["requests"]["cpu"]) == exp["tm_cpu"]
    assert tm_dep["spec"]["replicas"] == exp["taskmanagers"]
    assert conf["taskmanager.numberOfTaskSlots"] == str(exp["slots"])
    assert conf["parallelism.default"] == str(exp["parallelism"])
    for key, value in exp["config"].items():
        assert conf.get(key) == value, key
    assert (conf.get("high-availability.type") == "kubernetes") is exp["ha"]
    args = jm["args"]
    if exp["entry"]:
        assert args[args.index("--job-classname") + 1] == exp["entry"]
    else:
        assert "--job-classname" not in args
    assert args[len(args) - len(exp["args"]):] == exp["args"]
