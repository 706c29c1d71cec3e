"""The receivers of notifications: a generic webhook (JSON, HMAC-signed), a Slack-compatible incoming webhook, and
e-mail over SMTP. The only module that talks to them. Each `send` makes one attempt with a timeout and raises
`ReportError` (TransientReportError when a retry may help); retrying is delivery.py's business.

The webhook's signature (docs/alerts.md#webhook), after Stripe's and GitHub's: header
`X-Flink-Reconciler-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>" under the shared secret>`;
a receiver recomputes it, compares in constant time and refuses an old `t` (a replay).
"""

from __future__ import annotations

import hashlib
import hmac
import smtplib
import ssl
import time
from collections.abc import Callable
from email.message import EmailMessage
from pathlib import Path
from typing import Protocol

import httpx
from pydantic import SecretStr

from reconciler import __version__
from reconciler.alerting.config import SinkConfig
from reconciler.alerting.message import Notification, email_text, slack_body, webhook_body
from reconciler.errors import ConfigError, ReportError, TransientReportError

SIGNATURE_HEADER = "X-Flink-Reconciler-Signature"
USER_AGENT = f"flink-reconciler/{__version__}"


class Sink(Protocol):
    name: str
    kind: str

    def send(self, n: Notification) -> None: ...


def sign(secret: bytes, body: bytes, timestamp: int) -> str:
    mac = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(secret: bytes, body: bytes, header: str, *, now: float, tolerance_s: float = 300.0) -> bool:
    """What a receiver does with the header (the tests' receiver uses it; docs/alerts.md shows it)."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        ts = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - ts) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, body, ts), f"t={ts},v1={parts.get('v1', '')}")


class HttpSink:
    """The generic webhook (kind `webhook`) or a Slack-compatible one (kind `slack`)."""

    def __init__(self, name: str, kind: str, url: str, *, secret: bytes | None = None, timeout: float = 5.0,
                 wall: Callable[[], float] = time.time) -> None:
        self.name, self.kind = name, kind
        self._url = url
        self._secret = secret
        self._wall = wall
        self._client = httpx.Client(timeout=timeout, follow_redirects=False, headers={"User-Agent": USER_AGENT})

    def send(self, n: Notification) -> None:
        body = slack_body(n) if self.kind == "slack" else webhook_body(n)
        headers = {"Content-Type": "application/json"}
        if self._secret is not None:
            headers[SIGNATURE_HEADER] = sign(self._secret, body, int(self._wall()))
        try:
            resp = self._client.post(self._url, content=body, headers=headers)
        except httpx.HTTPError as e:  # never the URL in the message: a Slack URL is a credential
            raise TransientReportError(f"sink {self.name}: {type(e).__name__}") from None
        if resp.status_code >= 500 or resp.status_code == 429:
            raise TransientReportError(f"sink {self.name}: HTTP {resp.status_code}")
        if resp.status_code >= 300:
            raise ReportError(f"sink {self.name}: HTTP {resp.status_code} (not retried)")

    def close(self) -> None:
        self._client.close()


class SmtpSink:
    kind = "smtp"

    def __init__(self, cfg: SinkConfig, password: str | None) -> None:
        assert cfg.smtp_host is not None and cfg.mail_from is not None
        self.name = cfg.name
        self._cfg = cfg
        self._password = password

    def send(self, n: Notification) -> None:
        cfg = self._cfg
        assert cfg.smtp_host is not None and cfg.mail_from is not None
        subject, text = email_text(n)
        msg = EmailMessage()
        msg["Subject"], msg["From"], msg["To"] = subject, cfg.mail_from, ", ".join(cfg.mail_to)
        msg.set_content(text)
        try:
            if cfg.smtp_security == "tls":
                smtp: smtplib.SMTP = smtplib.SMTP_SSL(cfg.smtp_host, cfg.smtp_port, timeout=cfg.timeout,
                                                      context=ssl.create_default_context())
            else:
                smtp = smtplib.SMTP(cfg.smtp_host, cfg.smtp_port, timeout=cfg.timeout)
            with smtp:
                if cfg.smtp_security == "starttls":
                    smtp.starttls(context=ssl.create_default_context())
                if cfg.username:
                    smtp.login(cfg.username, self._password or "")
                smtp.send_message(msg)
        except smtplib.SMTPResponseException as e:
            cls = TransientReportError if 400 <= e.smtp_code < 500 else ReportError
            raise cls(f"sink {self.name}: SMTP {e.smtp_code}") from None
        except (OSError, smtplib.SMTPException) as e:
            raise TransientReportError(f"sink {self.name}: {type(e).__name__}: {e}") from None

    def close(self) -> None:
        pass


def _secret(value: SecretStr | None, file: Path | None, what: str) -> str | None:
    if value is not None:
        return value.get_secret_value()
    if file is None:
        return None
    try:
        text = file.read_text(encoding="utf-8").rstrip("\r\n")
    except OSError as e:
        raise ConfigError(f"alerting: {what}: cannot read {file}: {e.strerror}") from e
    if not text:
        raise ConfigError(f"alerting: {what}: {file} is empty")
    return text


def secrets_of(cfg: SinkConfig) -> list[str]:
    """Every secret value of a sink, to register with the log redaction."""
    out = [_secret(cfg.url, cfg.url_file, f"sink {cfg.name} url"),
           _secret(cfg.hmac_secret, cfg.hmac_secret_file, f"sink {cfg.name} hmac_secret"),
           _secret(cfg.password, cfg.password_file, f"sink {cfg.name} password")]
    return [s for s in out if s]


def make_sink(cfg: SinkConfig) -> HttpSink | SmtpSink:
    """A sink from its settings; secret files are read now, so a missing one fails at startup (ConfigError)."""
    if cfg.type == "smtp":
        return SmtpSink(cfg, _secret(cfg.password, cfg.password_file, f"sink {cfg.name} password"))
    url = _secret(cfg.url, cfg.url_file, f"sink {cfg.name} url")
    assert url is not None
    if not url.lower().startswith(("http://", "https://")):
        raise ConfigError(f"alerting: sink {cfg.name}: url must be http:// or https://")
    key = _secret(cfg.hmac_secret, cfg.hmac_secret_file, f"sink {cfg.name} hmac_secret")
    return HttpSink(cfg.name, cfg.type, url, secret=key.encode() if key else None, timeout=cfg.timeout)
