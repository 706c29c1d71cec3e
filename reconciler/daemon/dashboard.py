"""The daemon's dashboard: the ui package's pages over this process's own reconcilers (their records, the
branch tip their last pass loaded, their app states), on the daemon's HTTP port."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from reconciler.alerting.alerter import ActiveAlert
from reconciler.apply.journal import Journal
from reconciler.clock import Clock
from reconciler.daemon.ports import ReconcileService
from reconciler.daemon.shards import ShardedService
from reconciler.errors import SpecError
from reconciler.live.ports import Runtime
from reconciler.service.factories import make_policy
from reconciler.service.reconcile import Reconciler
from reconciler.settings import Settings
from reconciler.spec.load import LoadResult
from reconciler.spec.policy import SpecPolicy
from reconciler.ui.model import Tip
from reconciler.ui.read import ReadSide
from reconciler.ui.web import Dashboard, UiAuth


def dashboard_for(service: ReconcileService, settings: Settings, clock: Clock, *,
                  alerts: Callable[[], Sequence[ActiveAlert]] | None = None) -> Dashboard | None:
    """None when the UI is off, or for a service that is not ours (a test's fake)."""
    if not settings.ui_enabled:
        return None
    if isinstance(service, Reconciler):
        source = service.source

        def reconcilers() -> list[Reconciler]:
            return [service]
    elif isinstance(service, ShardedService):
        source = service.source

        def reconcilers() -> list[Reconciler]:
            return [r for _, r in sorted(service.reconcilers().items())]
    else:
        return None
    views: dict[int, tuple[Journal, Journal]] = {}

    def journals() -> Sequence[Journal]:
        """A Journal of our own over each reconciler's store: same records, its own cache and lock, so a page
        never waits for (or refreshes the cache of) a running pass."""
        out = []
        for r in reconcilers():
            hit = views.get(id(r.journal))
            if hit is None or hit[0] is not r.journal:
                hit = views[id(r.journal)] = (r.journal, Journal(r.journal.path, clock, store=r.journal.store))
            out.append(hit[1])
        return out

    def tip() -> Tip | None:
        loaded = [got for r in reconcilers() if (got := r.loaded()) is not None]
        if not loaded:
            return None
        rev = loaded[0][0]
        parts = [lr for r, lr in loaded if r == rev]
        return Tip(revision=rev, loaded=parts[0] if len(parts) == 1 else _merged(parts))

    def states() -> dict[str, tuple[str, str]]:
        out: dict[str, tuple[str, str]] = {}
        for r in reconcilers():
            out.update(r.app_states())
        return out

    def runtimes() -> list[tuple[Runtime, Callable[[str], bool]]]:
        """The runtime of each shard this replica holds now (they come and go), with the apps it owns."""
        return [(r.runtime, r.shard.owns if r.shard else _every) for r in reconcilers() if r.runtime is not None]

    read = ReadSide(journals=journals, tip=tip, clock=clock, runtime=runtimes, pass_states=states, source=source,
                    repo_url=settings.repo_url, subdir=settings.path,
                    policy=dataclasses.replace(make_policy(settings),
                                               warm_standby=settings.runtime in ("local", "kubernetes")),
                    spec_policy=SpecPolicy(settings.spec_policy), mode="daemon")
    token = settings.ui_auth.get_secret_value() if settings.ui_auth is not None else None
    return Dashboard(read, auth=UiAuth.parse(token), alerts=alerts)  # rows are built on the first page asked for


def _every(_app: str) -> bool:
    return True


def _merged(parts: list[LoadResult]) -> LoadResult:
    """The specs of several shards at one revision, as one LoadResult (for display only)."""
    apps = {}
    errors: list[SpecError] = []
    for p in parts:
        apps.update(p.apps)
        errors.extend(p.errors)
    return LoadResult(apps=apps, errors=tuple(errors))
