"""Pure readings and spellings of Git's text, for `git.py`: URLs and their cache keys, `ls-tree -z` entries,
the lines of a note, blob ids. No git process here; git.py makes the calls.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

SCP_LIKE = re.compile(r"^[\w.-]+@[\w.-]+:")
_SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


def is_sha(text: str) -> bool:
    return bool(_SHA.match(text))


def normalize_url(url: str) -> str:
    """Plain paths (bare repo or working copy) become absolute; URLs stay as given."""
    if "://" in url or SCP_LIKE.match(url):
        return url
    return str(Path(url).expanduser().resolve())


def split_credentials(url: str) -> tuple[str, str | None, str | None]:
    """(url, user, password): credentials taken out of an http(s) URL so they never sit in .git/config,
    messages or logs (`https://user:pass@host/...`, `https://TOKEN@host/...`). ssh user names stay."""
    if "://" not in url:
        return url, None, None
    parts = urlsplit(url)
    if "@" not in parts.netloc or (parts.password is None and parts.scheme.lower() not in ("http", "https")):
        return url, None, None
    host = parts.netloc.rpartition("@")[2]
    clean = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return clean, unquote(parts.username or "") or None, unquote(parts.password) if parts.password else None


def cache_key(url: str) -> str:
    """A short stable name for the cache of `url`, so two repositories never share a cache and one keeps
    one: a local repository by its absolute, resolved path (however it was typed: '.', relative, via a
    symlink, file://), a remote one by its URL without credentials, scheme and host lower-cased,
    trailing '/' and '.git' dropped."""
    if url.startswith("file://"):
        url = unquote(urlsplit(url).path)
    url, _, _ = split_credentials(normalize_url(url))
    if "://" in url:
        parts = urlsplit(url)
        url = urlunsplit((parts.scheme.lower(), parts.netloc.lower(), parts.path, parts.query, ""))
    elif SCP_LIKE.match(url):
        host, _, path = url.partition(":")
        url = f"{host.lower()}:{path}"
    url = url.rstrip("/").removesuffix(".git").rstrip("/")
    return hashlib.sha256(url.encode()).hexdigest()[:16]


def ls_tree_entries(listing: bytes) -> list[tuple[bytes, bytes, str, str]]:
    """(mode, type, object id, path) of each entry of `git ls-tree -z` output."""
    out = []
    for entry in listing.split(b"\0"):
        if entry:
            meta, _, raw_path = entry.partition(b"\t")
            mode, kind, obj = meta.split(b" ")
            out.append((mode, kind, obj.decode(), raw_path.decode("utf-8", "surrogateescape")))
    return out


def may_hold_specs(entry: tuple[bytes, bytes, str, str]) -> bool:
    """A symlink named like a directory (no dot): it may stand for a folder of specs, so it is reported
    as unreadable rather than skipped (the specs that were in that folder must not look deleted)."""
    return entry[0] == b"120000" and "." not in entry[3].rsplit("/", 1)[-1]


def not_a_file(mode: bytes, kind: bytes, path: str) -> str | None:
    """Why a tree entry cannot be read as a spec file, or None when it can."""
    if not path.isprintable():
        return "has a control character (a newline?) in its path; rename the file"
    if mode == b"120000":
        return "is a symbolic link; symlinks are not followed, a spec must be a regular file"
    if kind == b"tree":
        return "is a directory, not a file"
    if kind != b"blob":
        return "is a submodule, not a file"
    return None


def norm_subdir(subdir: str) -> str:
    s = subdir.strip().replace("\\", "/").strip("/")
    while s.startswith("./"):
        s = s[2:]
    return "" if s == "." else s


def merge_lines(lines: Sequence[str], pairs: Sequence[tuple[str, str]]) -> list[str]:
    """`lines` with each key's line replaced in place (appended when absent; a later pair of the same key
    wins), other keys kept. Linear in the size of the note: a full pass writes thousands of lines at once."""
    new = dict(pairs)
    if not new:
        return list(lines)
    longest = max(len(k) for k in new)
    out: list[str] = []
    done: set[str] = set()
    for existing in lines:
        key = _key_of(existing, new, longest)
        if key is None:
            out.append(existing)
        elif key not in done:
            out.append(new[key])
            done.add(key)
    out.extend(line for key, line in new.items() if key not in done)
    return out


def _key_of(line: str, keys: Mapping[str, str], longest: int) -> str | None:
    """The key among `keys` that `line` is the line of: the whole line, or a prefix ending at ':' or ' '."""
    if line in keys:
        return line
    for i, c in enumerate(line[: longest + 1]):
        if c in ": " and line[:i] in keys:
            return line[:i]
    return None


def blob_sha(data: bytes) -> str:
    """Git's blob id of `data` (what `git hash-object` prints), to key caches by content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()

