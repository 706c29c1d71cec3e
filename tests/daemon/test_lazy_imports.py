"""A local or dry-run reconciler never imports the kubernetes client: it is a fifth of the start-up imports.

`make_record_store` asks whether a runtime is a KubernetesRuntime only once `reconciler.live.kubernetes.runtime` is
loaded (by `make_runtime` for `runtime: kubernetes`). A fresh interpreter shows what one command loads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys
import reconciler.cli
from reconciler.clock import SystemClock
from reconciler.service.factories import make_record_store, make_runtime
from reconciler.live.records import FileRecordStore
from reconciler.settings import load_settings

settings = load_settings({"state_dir": sys.argv[1], "runtime": "local", "dry_run": sys.argv[2] == "dry"})
runtime = make_runtime(settings, SystemClock())
assert isinstance(make_record_store(settings, runtime), FileRecordStore)
print(" ".join(sorted(m for m in sys.modules if m.partition(".")[0] == "kubernetes"
                      or m.startswith("reconciler.live.k8s"))))
"""


@pytest.mark.parametrize("mode", ["dry", "local"])
def test_a_local_or_dry_run_reconciler_does_not_import_the_kubernetes_client(tmp_path: Path, mode: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLINK_RECONCILER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "state"), mode], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"imported for a {mode} reconciler: {done.stdout.strip()}"
