"""Real Git repositories for tests: a working copy with a bare repo as origin."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "Test", "GIT_COMMITTER_EMAIL": "test@example.com",
    "GIT_CONFIG_NOSYSTEM": "1", "HOME": os.environ.get("HOME", "/tmp"),
}


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


class Repo:
    """A working copy whose origin is a bare repository, like a developer's clone."""

    def __init__(self, root: Path) -> None:
        self.origin = root / "origin.git"
        self.work = root / "work"
        git(root, "init", "-q", "--bare", "-b", "main", str(self.origin))
        git(root, "clone", "-q", str(self.origin), str(self.work))
        git(self.work, "checkout", "-q", "-b", "main")

    def write(self, path: str, text: str | bytes) -> None:
        p = self.work / path
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text)

    def remove(self, path: str) -> None:
        git(self.work, "rm", "-q", path)

    def commit(self, message: str) -> str:
        git(self.work, "add", "-A")
        git(self.work, "commit", "-q", "--allow-empty", "-m", message)
        git(self.work, "push", "-q", "origin", "HEAD:main")
        return git(self.work, "rev-parse", "HEAD")


def spec(name: str, *, parallelism: int = 1, mode: str = "savepoint", extra: str = "") -> str:
    return f"""\
apiVersion: flink-reconciler.io/v1alpha1
kind: FlinkApp
metadata:
  name: {name}
spec:
  taskManager:
    slots: 4
  job:
    jarURI: jobs/counter.jar
    parallelism: {parallelism}
    upgradeMode: {mode}
{extra}"""
