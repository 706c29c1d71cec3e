"""One daemon per state directory: an flock on <state_dir>/daemon.lock that holds the owner's PID.

flock (not a PID file alone) because the kernel drops it when the process dies, however it dies, so a
crash never leaves a stale lock to clean by hand. The descriptor is opened non-inheritable (Python's
default, PEP 446): Flink JVMs started by the local runtime must not keep the lock alive after us.
The file is left in place on release; deleting it would race with a starting daemon.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from reconciler.errors import ConfigError

LOCK_NAME = "daemon.lock"


class DaemonLock:
    def __init__(self, state_dir: Path | str) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ConfigError naming the PID that holds it."""
        if self._fd is not None:
            return
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise ConfigError(f"cannot create lock file {self.path}: {e.strerror or e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"PID {holder}" if holder else "another process (PID not yet written)"
            raise ConfigError(
                f"another flink-reconciler daemon is already using state directory {self.state_dir}: "
                f"{who} holds {self.path}. Stop it first, or give this one a different --state-dir."
            ) from None
        except OSError as e:
            os.close(fd)
            raise ConfigError(f"cannot lock {self.path}: {e.strerror or e}") from e
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> DaemonLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None
