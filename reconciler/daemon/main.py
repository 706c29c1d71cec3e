"""`flink-reconciler run` in one call: lock the state dir, build the service, run the daemon.

The CLI parses flags into Settings and sets up logging; this takes it from there. The service is built
by a factory *after* the lock is held, so a second daemon never opens the journal at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from reconciler.clock import Clock, SystemClock
from reconciler.daemon.lock import DaemonLock
from reconciler.daemon.metrics import Metrics
from reconciler.daemon.ports import ReconcileService
from reconciler.daemon.scheduler import Daemon
from reconciler.errors import ConfigError
from reconciler.settings import Settings

log = logging.getLogger(__name__)

ServiceFactory = Callable[[Settings, Metrics, Clock], ReconcileService]


def run(settings: Settings, make_service: ServiceFactory, *, clock: Clock | None = None) -> int:
    """Run the daemon until SIGTERM/SIGINT; returns the process exit code. Raises ConfigError early."""
    if not settings.repo_url:
        raise ConfigError("`run` needs a repository: --repo or FLINK_RECONCILER_REPO_URL")
    clock = clock if clock is not None else SystemClock()
    with DaemonLock(settings.state_dir) as lock:
        log.info("starting flink-reconciler daemon", extra={"lock": str(lock.path), "settings": settings.redacted()})
        metrics = Metrics()
        service = make_service(settings, metrics, clock)
        return Daemon(service, settings, metrics, clock).run_forever()
