"""Which configuration values are secrets, and how a structured value looks with them masked. Pure (no
process state), so the planner can mask what it shows: a plan is posted on pull requests, kept in git notes
and logged, and a changed `s3.secret-key` must not appear in any of them.

`logs.redact_config()` adds the process-wide masking (registered tokens, URL user-info) on top.
"""

from __future__ import annotations

from typing import Any

REDACTED = "***"

# Flink's own rule (GlobalConfiguration.isSensitive), plus the cloud key names that turn up in
# flinkConfiguration: a key containing any of these (case-insensitive) holds a secret value.
SENSITIVE_KEY_PARTS = ("password", "secret", "token", "apikey", "api-key", "api_key", "auth-params", "service-key",
                       "basic-auth", "jaas.config", "http-headers", "account.key", "access-key", "access.key",
                       "private-key", "private.key", "credential")


def looks_secret(key: str) -> bool:
    """Whether a configuration key (a flinkConfiguration entry, an env var name) names a secret value."""
    k = key.lower()
    return any(part in k for part in SENSITIVE_KEY_PARTS)


def _set(value: Any) -> bool:
    return value not in (None, "")


def mask_config(value: Any, key: str = "") -> Any:
    """`value` (a spec, a flinkConfiguration map, one entry's value under `key`) with the values of secret-looking
    keys replaced by `***`, at any depth. A Kubernetes env entry (`{name: AWS_SECRET_ACCESS_KEY, value: ...}`)
    counts as a key too."""
    if isinstance(value, dict):
        named_secret = isinstance(value.get("name"), str) and looks_secret(value["name"])
        return {k: REDACTED if (looks_secret(str(k)) or (named_secret and k == "value")) and _set(v)
                else mask_config(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mask_config(v, key) for v in value]
    if key and looks_secret(key) and _set(value):
        return REDACTED
    return value
