"""Job jars: a spec's `jarURI` -> a local file a runtime can upload.

Accepted forms: a path relative to the repository root (never escaping it), `file://` URIs and absolute
paths, `http(s)://` URLs (downloaded once into a cache, checked against `jarSHA256` when given), and
`local://` (a path inside a container image: nothing to resolve here, so None).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlparse

import httpx

from reconciler.errors import PermanentStepError, TransientStepError

_CHUNK = 1 << 16


def resolve_jar(
    jar_uri: str,
    *,
    repo_root: Path | None,
    cache_dir: Path,
    sha256: str | None = None,
    timeout: float = 60.0,
    client: httpx.Client | None = None,
) -> Path | None:
    """The local path of the job jar, or None for `local://` (inside the image).

    Raises PermanentStepError for anything that retrying cannot fix (missing file, escape from the
    repository, checksum mismatch, HTTP 4xx) and TransientStepError for network trouble and 5xx.
    """
    uri = jar_uri.strip()
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme == "local":
        return None
    if scheme in ("http", "https"):
        path = _download(uri, cache_dir=cache_dir, sha256=sha256, timeout=timeout, client=client)
    elif scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise PermanentStepError(f"jarURI {jar_uri!r}: file:// URIs must name a local path (no host)")
        path = Path(unquote(parsed.path))
    elif scheme == "":
        path = _repo_path(uri, repo_root)
    else:
        raise PermanentStepError(
            f"jarURI {jar_uri!r}: unsupported scheme {scheme!r} (use a repository path, file://, http(s):// "
            "or local://)"
        )
    if not path.is_file():
        raise PermanentStepError(f"jarURI {jar_uri!r}: {path} does not exist or is not a file")
    if sha256 is not None and scheme not in ("http", "https"):
        _check_sha(path, sha256, jar_uri)
    return path


def _repo_path(uri: str, repo_root: Path | None) -> Path:
    p = Path(uri)
    if p.is_absolute():
        return p
    if repo_root is None:
        raise PermanentStepError(f"jarURI {uri!r} is relative but there is no repository root to resolve it in")
    if ".." in PurePosixPath(uri).parts:
        raise PermanentStepError(f"jarURI {uri!r} leaves the repository ('..' is not allowed)")
    root = repo_root.resolve()
    path = (root / p).resolve()
    if not path.is_relative_to(root):  # a symlink pointing out of the repository
        raise PermanentStepError(f"jarURI {uri!r} resolves to {path}, outside the repository {root}")
    return path


def _sha_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _check_sha(path: Path, expected: str, uri: str) -> None:
    actual = _sha_of(path)
    if actual != expected.lower():
        raise PermanentStepError(f"jarURI {uri!r}: SHA-256 of {path} is {actual}, the spec expects {expected}")


def _download(
    url: str, *, cache_dir: Path, sha256: str | None, timeout: float, client: httpx.Client | None
) -> Path:
    """Fetch once: the cache key is the checksum when known (content-addressed), else the URL."""
    key = sha256.lower() if sha256 else "url-" + hashlib.sha256(url.encode()).hexdigest()[:32]
    name = PurePosixPath(urlparse(url).path).name or "job.jar"
    target = cache_dir / key / name
    if target.is_file() and (sha256 is None or _sha_of(target) == sha256.lower()):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    own = client is None
    http = client if client is not None else httpx.Client(timeout=timeout, follow_redirects=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".download-")
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, http.stream("GET", url, timeout=timeout) as resp:
            if resp.status_code >= 400:
                resp.read()
                text = resp.text.strip()[:300]
                msg = f"downloading {url} failed: HTTP {resp.status_code}" + (f": {text}" if text else "")
                if resp.status_code >= 500 or resp.status_code in (408, 429):
                    raise TransientStepError(msg)
                raise PermanentStepError(msg)
            for chunk in resp.iter_bytes(_CHUNK):
                h.update(chunk)
                out.write(chunk)
        if sha256 is not None and h.hexdigest() != sha256.lower():
            raise PermanentStepError(
                f"jarURI {url!r}: downloaded SHA-256 is {h.hexdigest()}, the spec expects {sha256}"
            )
        os.replace(tmp, target)
        return target
    except httpx.HTTPError as e:
        raise TransientStepError(f"downloading {url} failed: {type(e).__name__}: {e}") from e
    finally:
        tmp.unlink(missing_ok=True)
        if own:
            http.close()
