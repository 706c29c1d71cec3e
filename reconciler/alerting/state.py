"""When to notify: firing, resend, resolved. Pure (the caller passes `now`).

Followed: Alertmanager's `repeat_interval` (a firing alert is sent again only after this long; its default of 4h
is ours) and a `for` duration per trigger like a Prometheus rule's (a condition must hold this long before it
fires: a job down for a few seconds during Flink's own recovery pages nobody); Argo CD Notifications' `oncePer`
(one message per condition, not one per pass) and its "send on resolve" (a condition that clears sends one
resolved message, if it had fired).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from reconciler.alerting.conditions import Condition, Trigger

Key = tuple[Trigger, str]  # (trigger, app); app "" for the daemon's own conditions


class Status(StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


@dataclass(frozen=True)
class Tracked:
    condition: Condition  # as last seen
    since: datetime  # first seen active (pending until `for` has passed)
    firing: bool = False
    last_sent: datetime | None = None


@dataclass(frozen=True)
class Event:
    """A notification to send: a condition that fired, fired again (resend), or resolved."""

    status: Status
    condition: Condition
    since: datetime
    at: datetime
    repeat: bool = False


@dataclass(frozen=True)
class Timing:
    resend_interval: timedelta = timedelta(hours=4)
    send_resolved: bool = True
    for_: Mapping[Trigger, timedelta] | None = None  # per trigger; missing: fires at once

    def pending_for(self, trigger: Trigger) -> timedelta:
        return (self.for_ or {}).get(trigger, timedelta(0))


def advance(tracked: Mapping[Key, Tracked], active: Collection[Condition], now: datetime, timing: Timing, *,
            in_scope: Callable[[Key], bool] | None = None) -> tuple[dict[Key, Tracked], list[Event]]:
    """The next state and what to send. Only keys `in_scope` are judged (an incremental pass looked at a few
    apps: the others keep their state); None judges every key."""
    out: dict[Key, Tracked] = {}
    events: list[Event] = []
    seen: set[Key] = set()
    for c in active:
        if c.key in seen:
            continue
        seen.add(c.key)
        t = tracked.get(c.key) or Tracked(condition=c, since=now)
        t = replace(t, condition=c)
        if not t.firing and now - t.since >= timing.pending_for(c.trigger):
            t = replace(t, firing=True, last_sent=now)
            events.append(Event(Status.FIRING, c, t.since, now))
        elif t.firing and t.last_sent is not None and now - t.last_sent >= timing.resend_interval:
            t = replace(t, last_sent=now)
            events.append(Event(Status.FIRING, c, t.since, now, repeat=True))
        out[c.key] = t
    for key, t in tracked.items():
        if key in seen:
            continue
        if in_scope is not None and not in_scope(key):
            out[key] = t
        elif t.firing and timing.send_resolved:
            events.append(Event(Status.RESOLVED, t.condition, t.since, now))
    return out, events


def firing(tracked: Mapping[Key, Tracked]) -> list[Tracked]:
    """The conditions that fired and still hold, oldest first (the dashboard's active alerts)."""
    return sorted((t for t in tracked.values() if t.firing), key=lambda t: (t.since, t.condition.key))
