"""Real repositories for tests: a bare origin and a working copy that pushes to it (plain git CLI)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "Ada Author",
    "GIT_AUTHOR_EMAIL": "ada@example.com",
    "GIT_COMMITTER_NAME": "Ada Author",
    "GIT_COMMITTER_EMAIL": "ada@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": os.environ.get("HOME", "/tmp"),
    "LC_ALL": "C",
}


def git(cwd: Path, *args: str, input: bytes | None = None) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, env=ENV, input=input, capture_output=True, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr.decode()}")
    return proc.stdout.decode()


class Upstream:
    """A bare `origin.git` plus a working copy `work` cloned from it."""

    def __init__(self, root: Path, branch: str = "main") -> None:
        self.root = root
        self.branch = branch
        self.origin = root / "origin.git"
        self.work = root / "work"
        root.mkdir(parents=True, exist_ok=True)
        git(root, "init", "-q", "--bare", "-b", branch, str(self.origin))
        git(root, "init", "-q", "-b", branch, str(self.work))
        git(self.work, "remote", "add", "origin", str(self.origin))

    def commit(self, files: dict[str, str | bytes | None], message: str = "change") -> str:
        """Write (None: delete) files, commit and return the sha (not pushed)."""
        for rel, content in files.items():
            path = self.work / rel
            if content is None:
                git(self.work, "rm", "-q", rel)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
            git(self.work, "add", rel)
        git(self.work, "commit", "-q", "-m", message)
        return self.head()

    def head(self) -> str:
        return git(self.work, "rev-parse", "HEAD").strip()

    def push(self, *, force: bool = False) -> None:
        git(self.work, "push", "-q", *(["--force"] if force else []), "origin", f"HEAD:refs/heads/{self.branch}")
