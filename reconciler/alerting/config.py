"""The `alerting` setting: thresholds, timing, receivers (sinks) and who gets what (subscriptions).

A block of the daemon's settings (settings.py), given in the --config YAML file or as JSON in
FLINK_RECONCILER_ALERTING. Secrets (a webhook URL that carries its token, an HMAC key, an SMTP password) are
SecretStr, or read from a file (`*_file`, the way Kubernetes mounts a Secret), and never printed.
"""

from __future__ import annotations

import fnmatch
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, model_validator

from reconciler.alerting.conditions import Thresholds, Trigger
from reconciler.alerting.state import Timing
from reconciler.durations import parse_duration

Seconds = Annotated[float, BeforeValidator(parse_duration), Field(gt=0, le=86400 * 30, allow_inf_nan=False)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SinkConfig(_Model):
    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    type: Literal["webhook", "slack", "smtp"]
    url: SecretStr | None = None  # webhook, slack (a Slack URL is itself the credential)
    url_file: Path | None = None
    hmac_secret: SecretStr | None = None  # webhook: signs every body (docs/alerts.md#webhook)
    hmac_secret_file: Path | None = None
    smtp_host: str | None = None
    smtp_port: int = Field(587, ge=1, le=65535)
    smtp_security: Literal["starttls", "tls", "none"] = "starttls"
    username: str | None = None
    password: SecretStr | None = None
    password_file: Path | None = None
    mail_from: str | None = None
    mail_to: tuple[str, ...] = ()
    timeout: Seconds = 5.0  # one delivery attempt

    @model_validator(mode="after")
    def _complete(self) -> SinkConfig:
        if self.type in ("webhook", "slack") and (self.url is None) == (self.url_file is None):
            raise ValueError(f"sink {self.name}: a {self.type} sink needs exactly one of url, url_file")
        if self.type == "smtp":
            missing = [n for n in ("smtp_host", "mail_from") if getattr(self, n) is None]
            if not self.mail_to:
                missing.append("mail_to")
            if missing:
                raise ValueError(f"sink {self.name}: an smtp sink needs " + ", ".join(missing))
        for secret, file in (("hmac_secret", "hmac_secret_file"), ("password", "password_file")):
            if getattr(self, secret) is not None and getattr(self, file) is not None:
                raise ValueError(f"sink {self.name}: give {secret} or {file}, not both")
        return self


class Subscription(_Model):
    """Which triggers of which apps go to which sinks (Argo CD Notifications' subscriptions, in settings)."""

    sinks: tuple[str, ...] = ()  # empty: every sink
    triggers: tuple[Trigger, ...] = ()  # empty: every trigger
    apps: tuple[str, ...] = ("*",)  # globs on `namespace/app` or `app`; the daemon's own conditions match "*"

    def matches(self, trigger: Trigger, app: str, namespace: str) -> bool:
        if self.triggers and trigger not in self.triggers:
            return False
        if not app:
            return "*" in self.apps
        return any(fnmatch.fnmatchcase(f"{namespace}/{app}", p) or fnmatch.fnmatchcase(app, p) for p in self.apps)


class AlertingSettings(_Model):
    sinks: tuple[SinkConfig, ...] = ()
    subscriptions: tuple[Subscription, ...] = (Subscription(),)
    resend_interval: Seconds = 4 * 3600.0  # Alertmanager's repeat_interval default
    send_resolved: bool = True
    checkpoint_age_factor: float = Field(3.0, ge=1.0, le=1000.0)
    checkpoint_age_min: Seconds = 120.0
    job_down_for: Seconds = 300.0
    not_syncing_after: Seconds = 600.0
    git_fetch_failures: int = Field(3, ge=1, le=1000)
    queue_size: int = Field(1000, ge=1, le=1_000_000)  # per sink; beyond it notifications are dropped (counted)
    max_attempts: int = Field(5, ge=1, le=100)
    retry_backoff: Seconds = 1.0  # doubles per attempt ...
    retry_backoff_max: Seconds = 60.0  # ... up to this
    runbook_url: str = ""  # where docs/alerts.md is published; links are <runbook_url>#<alert in lower case>
    dashboard_url: str = ""  # this daemon's dashboard as users reach it (links to /apps/<app>)

    @model_validator(mode="after")
    def _known_sinks(self) -> AlertingSettings:
        names = [s.name for s in self.sinks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"sink names must be unique: {', '.join(dupes)}")
        for i, sub in enumerate(self.subscriptions):
            unknown = [n for n in sub.sinks if n not in names]
            if unknown:
                raise ValueError(f"subscriptions[{i}] names unknown sinks: {', '.join(unknown)}")
        return self

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds(checkpoint_age_factor=self.checkpoint_age_factor,
                          checkpoint_age_min=timedelta(seconds=self.checkpoint_age_min),
                          job_down_for=timedelta(seconds=self.job_down_for),
                          not_syncing_after=timedelta(seconds=self.not_syncing_after),
                          git_fetch_failures=self.git_fetch_failures)

    @property
    def timing(self) -> Timing:
        return Timing(resend_interval=timedelta(seconds=self.resend_interval), send_resolved=self.send_resolved)

    def sinks_for(self, trigger: Trigger, app: str, namespace: str) -> set[str]:
        out: set[str] = set()
        for sub in self.subscriptions:
            if sub.matches(trigger, app, namespace):
                out |= set(sub.sinks) if sub.sinks else {s.name for s in self.sinks}
        return out
