"""What a notification says, for each kind of receiver. Pure.

Nothing secret leaves: a message is built from named fields only (never a settings object, a spec or a record),
and the free text in it (a plan's reason, Flink's exception) goes through `logs.redact`, which removes URL
credentials and every secret the daemon registered (tokens, webhook secrets, SMTP passwords).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from reconciler.alerting.conditions import ALERTS, Trigger
from reconciler.alerting.state import Event, Status
from reconciler.logs import redact

MAX_DETAIL = 1000
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Notification:
    status: Status
    alert: str  # the Prometheus alert name of the trigger (FlinkAppCrashLooping, ...)
    trigger: str
    severity: str
    app: str  # "" for the daemon's own conditions
    namespace: str
    summary: str
    detail: str
    since: str  # ISO-8601 UTC
    at: str
    repeat: bool
    runbook_url: str
    url: str  # the app's page on the dashboard, when the daemon knows its own address

    @property
    def subject(self) -> str:
        who = f" {self.namespace}/{self.app}" if self.app and self.namespace else f" {self.app}" if self.app else ""
        return f"[{self.status.value.upper()}] {self.alert}{who}"


def notification(ev: Event, *, runbook_base: str = "", dashboard_url: str = "") -> Notification:
    c = ev.condition
    alert, severity = ALERTS[c.trigger]
    base = dashboard_url.rstrip("/")
    return Notification(
        status=ev.status, alert=alert, trigger=c.trigger.value, severity=severity, app=c.app, namespace=c.namespace,
        summary=redact(c.summary), detail=redact(c.detail)[:MAX_DETAIL],
        since=ev.since.isoformat(), at=ev.at.isoformat(), repeat=ev.repeat,
        runbook_url=runbook_url(c.trigger, runbook_base),
        url=(f"{base}/apps/{c.app}" if c.app else f"{base}/") if base else "",
    )


def runbook_url(trigger: Trigger, base: str = "") -> str:
    """The trigger's runbook section: `<base>#<alert in lower case>` (docs/alerts.md's headings are the alert names)."""
    anchor = ALERTS[trigger][0].lower()
    return f"{base}#{anchor}" if base else f"docs/alerts.md#{anchor}"


def webhook_body(n: Notification) -> bytes:
    """The generic webhook's JSON (docs/alerts.md#webhook): stable field names, versioned."""
    doc: dict[str, Any] = {
        "version": SCHEMA_VERSION, "status": n.status.value, "alert": n.alert, "trigger": n.trigger,
        "severity": n.severity, "app": n.app, "namespace": n.namespace, "summary": n.summary, "detail": n.detail,
        "since": n.since, "at": n.at, "repeat": n.repeat, "runbookURL": n.runbook_url, "url": n.url,
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def slack_body(n: Notification) -> bytes:
    """A Slack incoming-webhook message (`text` with mrkdwn: Mattermost and Rocket.Chat take the same)."""
    icon = ":white_check_mark:" if n.status is Status.RESOLVED else ":rotating_light:"
    lines = [f"{icon} *{n.subject}*", n.summary]
    if n.detail and n.status is Status.FIRING:
        lines.append(f"> {n.detail[:500]}")
    links = [f"<{n.runbook_url}|runbook>"] if "://" in n.runbook_url else [f"runbook: {n.runbook_url}"]
    if n.url:
        links.append(f"<{n.url}|dashboard>")
    lines.append(" · ".join(links) + f" · since {n.since}")
    return json.dumps({"text": "\n".join(lines)}).encode()


def email_text(n: Notification) -> tuple[str, str]:
    """(subject, plain-text body)."""
    body = [n.summary, ""]
    if n.detail:
        body += [n.detail, ""]
    body += [f"status:    {n.status.value}" + (" (repeated)" if n.repeat else ""),
             f"alert:     {n.alert} ({n.severity})"]
    if n.app:
        body.append(f"app:       {n.namespace}/{n.app}" if n.namespace else f"app:       {n.app}")
    body += [f"since:     {n.since}", f"runbook:   {n.runbook_url}"]
    if n.url:
        body.append(f"dashboard: {n.url}")
    return n.subject, "\n".join(body) + "\n"
