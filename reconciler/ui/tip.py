"""The branch tip for `flink-reconciler ui`, which runs no reconcile pass: a thread fetches the repository
every poll interval and loads the tip's specs when it moved (the daemon's dashboard reads its own passes')."""

from __future__ import annotations

import logging
import threading

from reconciler.errors import ReconcilerError
from reconciler.logs import redact
from reconciler.source.git import GitSource
from reconciler.source.specs import load_at, spec_paths
from reconciler.spec.load import SPEC_SUFFIXES
from reconciler.spec.policy import SpecPolicy
from reconciler.ui.model import Tip

log = logging.getLogger(__name__)


class TipWatcher:
    def __init__(self, source: GitSource, *, subdir: str = "", interval: float = 15.0,
                 spec_policy: SpecPolicy = SpecPolicy.RESTRICTED) -> None:
        self.source = source
        self.subdir = subdir
        self.interval = interval
        self.spec_policy = spec_policy
        self.error: str | None = None  # why the last fetch failed
        self._tip: Tip | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tip(self) -> Tip | None:
        return self._tip

    def refresh(self) -> None:
        """Fetch once; load the specs when the tip moved. A failure is kept (shown) and retried next time."""
        try:
            fetched = self.source.fetch()
            rev, old = fetched.new_sha, self._tip
            if old is None or old.revision != rev:
                if old is None or fetched.rewritten:
                    loaded = load_at(self.source, rev, self.subdir, policy=self.spec_policy)
                else:  # only the changed files: unchanged apps keep their parsed spec (and the rows their memo)
                    changed = sorted(p for p in self.source.changed_paths(old.revision, rev, self.subdir)
                                     if p.endswith(SPEC_SUFFIXES))
                    loaded = old.loaded.update(spec_paths(self.source.read_paths(rev, changed)))
                self._tip = Tip(revision=rev, loaded=loaded, subject=self.source.commit_info(rev).subject)
            self.error = None
        except ReconcilerError as e:
            self.error = redact(str(e))
            log.warning("ui: cannot read the branch tip: %s", self.error)

    def start(self) -> None:
        self.refresh()
        self._thread = threading.Thread(target=self._run, name="ui-tip", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.refresh()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
