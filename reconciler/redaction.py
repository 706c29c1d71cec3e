"""Which configuration values are secrets, and how a structured value looks with them masked. Pure (no
process state), so the planner can mask what it shows: a plan is posted on pull requests, kept in git notes
and logged, and a changed `s3.secret-key` must not appear in any of them.

`logs.redact_config()` adds the process-wide masking (registered tokens, URL user-info) on top.
"""

from __future__ import annotations

import re
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


# ------------------------------------------------------------------------------------------------ URLs
#
# The one rule for credentials in a URL, used for every URL shown anywhere (pages, JSON, logs, notes,
# status.txt, CLI output), alone or inside free text (a git error, a Flink message):
#   - `scheme://USERINFO@host...`: the user-info ends at the LAST `@` of the authority (RFC 3986, urlsplit,
#     git and curl agree), so a password holding a raw `@` is masked whole; it is masked when it holds a
#     password (`user:pw`) or the scheme is not ssh (`https://TOKEN@host`); `ssh://git@host` keeps its user.
#   - an authority whose "port" is not a number (`http://user:pa/ss@host/`: a raw `/`, `?` or `#` in the
#     password) is masked up to the last `@` of the word too: the URL is broken, its secret still is one.
#   - no scheme (`user:pw@host:path`, `user:pw@host/path`): a user-info with a password is masked;
#     `git@host:org/x.git` stays (an ssh user is no secret).
#   - a query parameter whose name looks secret (`?access_token=`, `&X-Amz-Signature=`, `sig=`): its value.

_SSH_SCHEMES = frozenset({"ssh", "git+ssh", "ssh+git", "sftp"})
_URL_START = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]{0,31})://")
_WORD_END = re.compile(r"[\s\"'<>\\`]")
_AUTHORITY_END = re.compile(r"[/?#]")
_WINDOW = 4096  # how far a URL's authority is looked for (keeps redaction linear on hostile text)
# user:password@host followed by ':' or '/' (scp-like or scheme-less), the password possibly holding raw '@'
_NO_SCHEME = re.compile(r"(?<![\w.+%/:-])[\w.+%-]{1,256}:[^\s/@\"'<>\\]{1,256}(?:@[^\s/@\"'<>\\]{1,256}){0,16}@"
                        r"(?=\[|[\w.-]{1,253}[:/])")
_QUERY_PARAM = re.compile(r"([?&;])([A-Za-z0-9_.~%-]{1,64})=([^&#\s\"'<>\\]+)")
_SECRET_QUERY_NAMES = frozenset({"sig", "signature", "key", "code", "auth", "session", "sessionid", "jwt"})


def _secret_query_name(name: str) -> bool:
    n = name.lower()
    return n in _SECRET_QUERY_NAMES or looks_secret(n) or "signature" in n


def _mask_query(m: re.Match[str]) -> str:
    return f"{m.group(1)}{m.group(2)}={REDACTED}" if _secret_query_name(m.group(2)) else m.group(0)


def _userinfo_end(text: str, start: int, scheme: str) -> int | None:
    """The index of the `@` that ends the user-info of the URL whose authority starts at `start`, when that
    user-info is to be masked."""
    window = text[start:start + _WINDOW]
    word_end = _WORD_END.search(window)
    word = window[:word_end.start()] if word_end else window
    a_end = _AUTHORITY_END.search(word)
    authority = word[:a_end.start()] if a_end else word
    at = authority.rfind("@")
    if at < 0:
        host = authority
        port = host.rpartition("]")[2] if host.startswith("[") else host
        if ":" not in port or port.rpartition(":")[2].isdigit() or "@" not in word:
            return None
        at = word.rfind("@")  # a broken authority (`user:pa/ss@host`): mask up to the word's last '@'
        return start + at
    userinfo = authority[:at]
    if ":" not in userinfo and scheme.lower() in _SSH_SCHEMES:
        return None
    return start + at


def redact_urls(text: str) -> str:
    """`text` (one URL, or free text holding URLs) with every URL credential replaced by `***`: the user-info
    of a URL (with or without a scheme) and secret-looking query parameters. Pure and linear in the text, so
    it runs on every log line and every value a page shows."""
    if "@" in text:
        out: list[str] = []
        pos = 0
        for m in _URL_START.finditer(text):
            if m.start() < pos:
                continue
            end = _userinfo_end(text, m.end(), m.group(1))
            if end is None:
                continue
            out.append(text[pos:m.end()])
            out.append(REDACTED)
            pos = end
        if out:
            text = "".join(out) + text[pos:]
        if ":" in text:
            text = _NO_SCHEME.sub(REDACTED + "@", text)
    if "=" in text:
        text = _QUERY_PARAM.sub(_mask_query, text)
    return text


def redact_url(url: str) -> str:
    """One URL (a repository, a webhook, a jar) fit to show: `redact_urls` on it."""
    return redact_urls(url)
