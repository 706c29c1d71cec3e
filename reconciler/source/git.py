"""The Git source: the one module that talks to Git (through GitPython).

A `GitSource` keeps a bare mirror of one origin in a cache directory and reads specs from any commit
straight out of the object database: no checkout, no working tree, so reading an old revision or a
pull-request head never disturbs what the daemon is running. Reads are batched through one
`git cat-file --batch` process because that is the hot path of every tick (10,000 files well under a
second; see bench/git_read.py).

Credentials never reach argv, logs or exception text: an https token travels as an
`http.extraHeader` given through `GIT_CONFIG_*` environment variables, an ssh key through
`GIT_SSH_COMMAND`, and every message built from git's stderr is redacted.

Over 600 lines because it is the only module importing Git: mirror, fetch, tree reads, notes and commits
all live here so that one place holds every Git call and its error mapping. The pure readings of Git's
text (URLs, cache keys, tree entries, note lines) are `git_text.py`.
"""

from __future__ import annotations

import base64
import logging
import os
import random
import re
import shlex
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote, urlsplit

import git
from pydantic import SecretStr

from reconciler.errors import SourceAuthError, SourceError, SourceMovedError, SourceUnreachableError
from reconciler.source.git_text import (
    SCP_LIKE,
    URL_USERINFO,
    blob_sha,
    cache_key,
    is_sha,
    ls_tree_entries,
    may_hold_specs,
    merge_lines,
    norm_subdir,
    normalize_url,
    not_a_file,
    redact_url,
    split_credentials,
)
from reconciler.spec.load import Unreadable
from reconciler.spec.model import repo_jar_path

log = logging.getLogger(__name__)

NOTES_REF = "refs/notes/flink-reconciler"
_REMOTE_NOTES_PREFIX = "refs/flink-reconciler/remote-notes/"
# A shard's own notes ref is `<ref>-shard-<i>` (report/gitnotes.py: shards never race on one ref).
_SHARD_SUFFIX = re.compile(r"-shard-[0-9]+")
_IDENTITY = {
    "GIT_AUTHOR_NAME": "flink-reconciler",
    "GIT_AUTHOR_EMAIL": "flink-reconciler@localhost",
    "GIT_COMMITTER_NAME": "flink-reconciler",
    "GIT_COMMITTER_EMAIL": "flink-reconciler@localhost",
}

# git's own words, in the C locale GitPython sets (LC_ALL=C).
_AUTH_PATTERNS = (
    "authentication failed",
    "could not read username",
    "could not read password",
    "terminal prompts disabled",
    "permission denied (publickey",
    "permission denied, please try again",
    "http basic: access denied",
    "the requested url returned error: 401",
    "the requested url returned error: 403",
    "invalid username or password",
    "host key verification failed",
)
_UNREACHABLE_PATTERNS = (
    "could not resolve host",
    "could not resolve hostname",
    "connection refused",
    "failed to connect",
    "connection timed out",
    "operation timed out",
    "no route to host",
    "network is unreachable",
    "does not appear to be a git repository",
    "repository not found",
    "not found",
    "unable to access",
    "could not read from remote repository",
    "connection reset",
    "timed out",
    "the remote end hung up",
)
_NON_FAST_FORWARD = ("non-fast-forward", "fetch first", "[rejected]", "cannot lock ref", "stale info",
                     "remote contains work")


def _lost_race(out: bytes, err: str) -> bool:
    """A push refused because the ref moved meanwhile. `--porcelain` prints the ref's verdict
    (`[rejected] (fetch first)`) on stdout, the hints on stderr: both are read."""
    said = f"{out.decode(errors='replace')}\n{err}".lower()
    return any(p in said for p in _NON_FAST_FORWARD)


@dataclass(frozen=True)
class FetchResult:
    """What one fetch changed on the tracked branch."""

    branch: str
    old_sha: str | None  # tip before the fetch (None on the first fetch)
    new_sha: str
    rewritten: bool  # the old tip is not an ancestor of the new one: history was force-pushed

    @property
    def changed(self) -> bool:
        return self.old_sha != self.new_sha


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    author_name: str
    author_email: str
    subject: str
    time: datetime


@dataclass(frozen=True)
class _Pending:
    sha: str
    key: str
    line: str


class GitSource:
    """A bare mirror of `url` in `cache_dir`, read without checkouts.

    `url` may be file://, https://, ssh://, scp-style (git@host:path) or a plain path to a bare repo
    or a working copy. Branches are mirrored as `refs/heads/*` so revisions like "main", "v1.2",
    "HEAD~1" and shas resolve as in any clone; HEAD follows `branch`.
    """

    def __init__(
        self,
        url: str,
        cache_dir: Path,
        *,
        branch: str = "main",
        token: SecretStr | str | None = None,
        ssh_key_path: Path | None = None,
        token_username: str = "x-access-token",
        network_timeout: float = 120.0,
    ) -> None:
        self._url, url_user, url_secret = split_credentials(normalize_url(url))
        secret = token.get_secret_value() if isinstance(token, SecretStr) else token
        if url_user and not url_secret:
            # https://TOKEN@host/repo.git: a lone user name in an https URL is a token (GitHub style).
            url_user, url_secret = None, url_user
        self._token = secret or url_secret
        self._token_username = token_username if secret else (url_user or token_username)
        self._basic = (
            base64.b64encode(f"{self._token_username}:{self._token}".encode()).decode() if self._token else None
        )
        self._secrets = tuple(s for s in (self._token, url_secret, self._basic) if s)
        self._ssh_key_path = ssh_key_path
        self.branch = branch
        # Absolute: git runs with the cache as its cwd, so a relative --git-dir would point nowhere.
        self.cache_dir = Path(cache_dir).expanduser().absolute()
        self.git_dir = self.cache_dir / "repo.git"
        self._network_timeout = network_timeout
        self._is_local = self._url.startswith("file://") or (
            "://" not in self._url and not SCP_LIKE.match(self._url)
        )
        self._lock = threading.RLock()  # fetch and everything that moves the branches
        # Notes have their own lock: writing a full pass's statuses never holds up the next fetch.
        self._notes_lock = threading.RLock()
        self._pending_notes: dict[str, list[_Pending]] = {}
        self._advertised: bytes | None = None  # origin's branches, tags and HEAD at our last fetch
        self._tip: str | None = None  # the tracked branch's tip after that fetch
        self._git = git.Git(str(self.cache_dir))
        self._repo: git.Repo | None = None

    # ---------------------------------------------------------------- public: describing ourselves

    @property
    def url(self) -> str:
        """The origin URL without any credentials in it: safe to log and to show."""
        return self._url

    def __repr__(self) -> str:
        return f"GitSource(url={self._url!r}, branch={self.branch!r}, cache_dir={str(self.cache_dir)!r})"

    # ---------------------------------------------------------------- fetching

    def fetch(self) -> FetchResult:
        """Clone on first use, fetch afterwards; a force-pushed branch is taken as is (new tip wins).

        One `git ls-remote` first: when origin advertises the same branches, tags and HEAD as at our last
        fetch, nothing else runs (an idle poll costs one git process, not five)."""
        with self._lock:
            self._ensure_repo()
            advertised = self._advertised_refs()
            if advertised is not None and advertised == self._advertised:
                tip = self._ref_sha(f"refs/heads/{self.branch}") if self._tip is None else self._tip
                if tip is not None:
                    self._tip = tip
                    return FetchResult(branch=self.branch, old_sha=tip, new_sha=tip, rewritten=False)
            result = self._fetch()
            self._advertised, self._tip = advertised, result.new_sha
            return result

    def _advertised_refs(self) -> bytes | None:
        """What origin advertises for its branches, tags and HEAD (None when it would not tell)."""
        out = self._run(["ls-remote", "origin"], network=True, what=f"fetch {self._url}")
        wanted = [line for line in out.splitlines()
                  if line.endswith(b"\tHEAD") or b"\trefs/heads/" in line or b"\trefs/tags/" in line]
        return b"\n".join(sorted(wanted)) or None

    def _fetch(self) -> FetchResult:
        with self._lock:
            old = self._ref_sha(f"refs/heads/{self.branch}")
            self._run(
                [
                    "fetch",
                    "--prune",
                    "--force",
                    "--no-write-fetch-head",
                    "--no-recurse-submodules",
                    "origin",
                    "+refs/heads/*:refs/heads/*",
                    "+refs/tags/*:refs/tags/*",
                ],
                network=True,
                what=f"fetch {self._url}",
            )
            if self._is_local:
                # A working copy's checked-out commit (maybe detached) as "origin/HEAD", so a local
                # `plan --head origin/HEAD` sees what the user has checked out.
                self._run(
                    ["fetch", "--no-write-fetch-head", "origin", "+HEAD:refs/remotes/origin/HEAD"],
                    network=True,
                    what=f"fetch HEAD of {self._url}",
                    ok_stderr=("couldn't find remote ref",),
                )
            new = self._ref_sha(f"refs/heads/{self.branch}")
            if new is None:
                raise SourceError(f"branch {self.branch!r} does not exist on origin {self._url}")
            self._run(["symbolic-ref", "HEAD", f"refs/heads/{self.branch}"], what="set HEAD")
            rewritten = old is not None and old != new and not self.is_ancestor(old, new)
            if rewritten:
                log.warning("history of %s was rewritten: %s is not an ancestor of %s", self.branch, old, new)
            return FetchResult(branch=self.branch, old_sha=old, new_sha=new, rewritten=rewritten)

    def head(self) -> str:
        """The tracked branch's tip as of the last fetch."""
        return self.resolve(f"refs/heads/{self.branch}")

    # ---------------------------------------------------------------- resolving and reading

    def resolve(self, rev: str) -> str:
        """Full sha of the commit `rev` names (branch, tag, sha, HEAD~1, ...)."""
        self._require_repo()
        status, out, _ = self._exec(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"])
        sha = out.decode().strip()
        if status != 0 or not is_sha(sha):
            raise SourceError(f"unknown revision {rev!r} in {self._url}")
        return sha

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        status, _, err = self._exec(["merge-base", "--is-ancestor", ancestor, descendant])
        if status in (0, 1):
            return status == 0
        raise SourceError(f"git merge-base {ancestor} {descendant} failed: {self._redact(err)}")

    def read_tree(
        self, rev: str, subdir: str = "", suffixes: Sequence[str] = (".yaml", ".yml")
    ) -> dict[str, bytes | Unreadable]:
        """Every file under `subdir` at `rev` whose name ends in one of `suffixes` (empty: all files).

        A path with a wanted suffix that is not a regular file (a symlink, a directory, a submodule) or
        that holds a control character is returned as `Unreadable`, never skipped: a spec that turns
        into one of those must not look deleted. Symlinks are never followed."""
        sha = self.resolve(rev)
        prefix = norm_subdir(subdir)
        args = ["ls-tree", "-r", "-t", "-z", "--full-tree", sha]
        if prefix:
            args += ["--", prefix]
        listing = self._run(args, what=f"list tree of {rev}")
        entries = []
        for entry in ls_tree_entries(listing):
            path = entry[3]
            if prefix and not path.startswith(prefix + "/"):
                continue  # the prefix directory itself, or a sibling sharing its name as a prefix
            if suffixes and not path.endswith(tuple(suffixes)) and not may_hold_specs(entry):
                continue
            entries.append(entry)
        return self._read_entries(entries)

    def read_paths(self, rev: str, paths: Iterable[str]) -> dict[str, bytes | Unreadable | None]:
        """The files `paths` at `rev`: None for a path that does not exist there, `Unreadable` for one
        that is not a regular file (symlink, directory, submodule) or holds a control character."""
        sha = self.resolve(rev)
        wanted = list(dict.fromkeys(p.lstrip("/") for p in paths))
        found: list[tuple[bytes, bytes, str, str]] = []
        for i in range(0, len(wanted), 256):  # argv stays small however many files a push changed
            chunk = [p for p in wanted[i : i + 256] if p]
            if chunk:
                out = self._run(["ls-tree", "-z", "--full-tree", sha, "--", *chunk], what=f"list paths at {rev}")
                found.extend(e for e in ls_tree_entries(out) if e[3] in chunk)
        read = self._read_entries(found)
        # A file whose directory became a symlink is not deleted: it is behind a link we do not follow.
        missing = [p for p in wanted if p not in read]
        parents = sorted({"/".join(p.split("/")[:i]) for p in missing for i in range(1, p.count("/") + 1)})
        links: set[str] = set()
        for i in range(0, len(parents), 256):
            chunk = parents[i : i + 256]
            out = self._run(["ls-tree", "-z", "--full-tree", sha, "--", *chunk], what=f"list paths at {rev}")
            links.update(e[3] for e in ls_tree_entries(out) if e[0] == b"120000" and e[3] in chunk)
        for p in missing:
            link = next((d for d in sorted(links) if p.startswith(d + "/")), None)
            if link:
                read[p] = Unreadable(f"is under {link!r}, which is a symbolic link; symlinks are not followed")
        return {p: read.get(p) for p in wanted}

    def _read_entries(self, entries: Sequence[tuple[bytes, bytes, str, str]]) -> dict[str, bytes | Unreadable]:
        out: dict[str, bytes | Unreadable] = {}
        blobs: list[tuple[str, str]] = []
        for mode, kind, obj, path in entries:
            problem = not_a_file(mode, kind, path)
            if problem:
                out[path] = Unreadable(problem)
            else:
                blobs.append((path, obj))
        contents = self._cat_batch([obj for _, obj in blobs])
        for (path, _), data in zip(blobs, contents, strict=True):
            out[path] = data if data is not None else Unreadable("its blob is missing from the repository")
        return dict(sorted(out.items()))

    def read_file(self, rev: str, path: str) -> bytes:
        data = self.read_paths(rev, [path])[path.lstrip("/")]
        if data is None:
            raise SourceError(f"{path!r} does not exist at {rev!r} in {self._url}")
        if isinstance(data, Unreadable):
            raise SourceError(f"{path!r} at {rev!r} {data.reason}")
        return data

    def changed_paths(self, a: str, b: str, subdir: str = "") -> set[str]:
        """Paths added, modified or deleted between commits a and b (renames count as both paths)."""
        sha_a, sha_b = self.resolve(a), self.resolve(b)
        prefix = norm_subdir(subdir)
        args = ["diff", "--name-only", "-z", "--no-renames", "--no-ext-diff", sha_a, sha_b]
        if prefix:
            args += ["--", prefix]
        out = self._run(args, what=f"diff {a}..{b}")
        paths = {p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p}
        return {p for p in paths if not prefix or p == prefix or p.startswith(prefix + "/")}

    def materialize(self, rev: str, path: str, dest_dir: Path) -> Path:
        """Write the blob at rev:path into dest_dir once, named by blob sha (e.g. a job jar in Git).
        `path` is read as a jarURI is: `jobs/./x.jar` and `jobs/sub/../x.jar` name `jobs/x.jar`."""
        try:
            path = repo_jar_path(path) or path
        except ValueError as e:
            raise SourceError(f"cannot read {path!r}: {e}") from None
        sha = self.resolve(rev)
        status, out, _ = self._exec(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{sha}:{path}"])
        blob = out.decode().strip()
        if status != 0 or not is_sha(blob):
            raise SourceError(f"{path!r} does not exist at {rev!r} in {self._url}")
        listed = ls_tree_entries(self._run(["ls-tree", "-z", "--full-tree", sha, "--", path.lstrip("/")],
                                            what=f"inspect {path}"))
        problem = next((not_a_file(m, k, p) for m, k, _, p in listed if p == path.lstrip("/")), "is not a file")
        if problem:
            raise SourceError(f"{path!r} at {rev!r} {problem}")
        dest_dir = Path(dest_dir)
        dest_dir.mkdir(parents=True, exist_ok=True)
        dest = dest_dir / f"{blob[:16]}-{Path(path).name}"
        if dest.exists():
            return dest
        fd, tmp = tempfile.mkstemp(dir=dest_dir, prefix=".materialize-")
        try:
            with os.fdopen(fd, "wb") as fh:
                try:
                    self._git.execute(
                        ["git", "--git-dir", str(self.git_dir), "cat-file", "blob", blob], output_stream=fh
                    )
                except git.GitCommandError as e:
                    raise SourceError(f"git cat-file blob {blob} failed: {self._redact(str(e.stderr))}") from None
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return dest

    def commit_info(self, rev: str) -> CommitInfo:
        sha = self.resolve(rev)
        try:
            commit = self._require_repo().commit(sha)
            return CommitInfo(
                sha=sha,
                author_name=str(commit.author.name),
                author_email=str(commit.author.email),
                subject=str(commit.summary),
                time=datetime.fromtimestamp(commit.authored_date, UTC),
            )
        except (ValueError, git.GitError) as e:
            raise SourceError(f"cannot read commit {sha}: {self._redact(str(e))}") from None

    # ---------------------------------------------------------------- git notes

    def add_note(self, rev: str, app_line_key: str, line: str, ref: str = NOTES_REF) -> None:
        """Set the line for `app_line_key` in the note on `rev` (replaced in place, or appended)."""
        self.add_notes(rev, {app_line_key: line}, ref)

    def add_notes(self, rev: str, lines: Mapping[str, str], ref: str = NOTES_REF) -> None:
        """Set several keys' lines in the note on `rev` with one read and one write of the note."""
        if any("\n" in k or "\n" in v for k, v in lines.items()):
            raise SourceError("a note line must be a single line")
        with self._notes_lock:
            sha = self.resolve(rev)
            self._write_note_lines(ref, sha, list(lines.items()))
            self._pending_notes.setdefault(ref, []).extend(_Pending(sha, k, v) for k, v in lines.items())

    def read_note(self, rev: str, ref: str = NOTES_REF) -> str | None:
        sha = self.resolve(rev)
        status, out, _ = self._exec(["notes", "--ref", ref, "show", sha])
        return out.decode() if status == 0 else None

    def push_notes(self, ref: str = NOTES_REF, *, attempts: int = 12) -> None:
        """Publish our note lines on origin without clobbering another writer's.

        Fetch origin's notes, put the lines written here since the last push on top of them, push
        fast-forward only; if someone pushed meanwhile, do it again. Holds only the notes lock: a fetch
        (the next poll) runs meanwhile.
        """
        with self._notes_lock:
            self._require_repo()
            remote_ref = _REMOTE_NOTES_PREFIX + ref.removeprefix("refs/notes/")
            last_error = ""
            for attempt in range(1, attempts + 1):
                pending = list(self._pending_notes.get(ref, []))
                self._exec(["update-ref", "-d", remote_ref])
                self._run(
                    ["fetch", "--no-write-fetch-head", "origin", f"+{ref}:{remote_ref}"],
                    network=True,
                    what=f"fetch notes from {self._url}",
                    ok_stderr=("couldn't find remote ref",),
                )
                remote_tip = self._ref_sha(remote_ref)
                local_tip = self._ref_sha(ref)
                if remote_tip is not None and local_tip != remote_tip and not (
                    local_tip is not None and self.is_ancestor(remote_tip, local_tip)
                ):
                    # Rebase our lines onto origin's notes: their lines stay, ours win per key.
                    self._run(["update-ref", ref, remote_tip], what="reset notes ref")
                    by_sha: dict[str, dict[str, str]] = {}
                    for p in pending:  # later lines of a key win, as they did when written
                        by_sha.setdefault(p.sha, {})[p.key] = p.line
                    for sha, lines in by_sha.items():
                        self._write_note_lines(ref, sha, list(lines.items()))
                if self._ref_sha(ref) is None or self._ref_sha(ref) == remote_tip:
                    self._drop_pending(ref, len(pending))
                    return
                # No delta search against origin's previous note: at 50,000 apps it cost 0.12 s of CPU per push
                # (most of a push, and shards push one after another) to send 22 KB instead of 147 KB.
                status, out, err = self._exec(
                    ["-c", "pack.window=0", "push", "--porcelain", "origin", f"{ref}:{ref}"], network=True
                )
                if status == 0:
                    self._drop_pending(ref, len(pending))
                    return
                last_error = self._redact(err)
                if not _lost_race(out, err):
                    raise self._classify(f"push notes to {self._url}", err)
                log.info("notes push to %s raced another writer (attempt %d), retrying", self._url, attempt)
                # Shards push to one notes ref at once: a random pause breaks the lockstep of their retries.
                time.sleep(random.uniform(0.0, min(2.0, 0.05 * 2**attempt)))
            raise SourceError(f"push notes to {self._url} kept being rejected after {attempts} attempts: {last_error}")

    def read_notes(self, ref: str = NOTES_REF) -> dict[str, str]:
        """Every note under `ref` and its shards' refs (`<ref>-shard-<i>`), origin's and ours merged (ours win
        per commit and ref): commit sha -> text, a commit's notes in several refs joined in ref order.

        Used once at start-up, to recover what earlier reconcilers wrote (lineage) when records are gone."""
        with self._notes_lock:
            self._require_repo()
            family = ref.removeprefix("refs/notes/")
            remote_prefix = _REMOTE_NOTES_PREFIX + family
            stale = self._refs_matching(remote_prefix + "*")
            if stale:
                self._run(["update-ref", "--stdin"], stdin="".join(f"delete {r}\n" for r in stale).encode(),
                          what="forget origin's notes")
            # A pattern, not a ref: no "couldn't find remote ref" when origin has none of them yet.
            self._run(["fetch", "--no-write-fetch-head", "origin", f"+{ref}*:{remote_prefix}*"], network=True,
                      what=f"fetch notes from {self._url}")
            names = {r.removeprefix(remote_prefix) for r in self._refs_matching(remote_prefix + "*")}
            names |= {r.removeprefix(ref) for r in self._refs_matching(ref + "*")}
            notes: dict[str, list[str]] = {}
            for suffix in sorted(n for n in names if n == "" or _SHARD_SUFFIX.fullmatch(n)):
                for commit, text in self._notes_of([remote_prefix + suffix, ref + suffix]).items():
                    notes.setdefault(commit, []).append(text)
            return {commit: texts[0] if len(texts) == 1 else "".join(t if t.endswith("\n") else t + "\n" for t in texts)
                    for commit, texts in notes.items()}

    def _notes_of(self, refs: Sequence[str]) -> dict[str, str]:
        """commit sha -> its note under the first of `refs`, replaced per commit by a later ref's."""
        notes: dict[str, str] = {}
        for r in refs:
            if self._ref_sha(r) is None:
                continue
            # ls-tree, not `git notes list`: `notes --ref` would rewrite a ref outside refs/notes/.
            # A notes tree names each commit by its path, possibly fanned out (ab/cdef...).
            entries = [line.split("\t", 1) for line in self._run(
                ["ls-tree", "-r", "-z", r], what="list notes").decode().split("\0") if "\t" in line]
            pairs = [(path.replace("/", ""), meta.split()[2]) for meta, path in entries]
            bodies = self._cat_batch([blob for _, blob in pairs])
            for (commit, _), body in zip(pairs, bodies, strict=True):
                if body is not None and is_sha(commit):
                    notes[commit] = body.decode(errors="replace")
        return notes

    def _refs_matching(self, pattern: str) -> list[str]:
        return self._run(["for-each-ref", "--format=%(refname)", pattern], what="list refs").decode().split()

    # ---------------------------------------------------------------- internals

    def _drop_pending(self, ref: str, count: int) -> None:
        lst = self._pending_notes.get(ref, [])
        del lst[:count]

    def _write_note_lines(self, ref: str, sha: str, pairs: Sequence[tuple[str, str]]) -> None:
        status, out, _ = self._exec(["notes", "--ref", ref, "show", sha])
        lines = out.decode().splitlines() if status == 0 else []
        merged = merge_lines(lines, pairs)
        if merged == lines:
            return
        body = ("\n".join(merged) + "\n").encode()
        self._run(["notes", "--ref", ref, "add", "-f", "-F", "-", sha], stdin=body, what=f"write note on {sha}")

    def _ensure_repo(self) -> git.Repo:
        if self._repo is not None:
            return self._repo
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SourceError(f"cannot create the git cache at {self.cache_dir}: {e.strerror}") from None
        if not (self.git_dir / "HEAD").exists():
            try:
                git.Repo.init(str(self.git_dir), bare=True)
            except git.GitError as e:
                raise SourceError(f"cannot create the git cache at {self.git_dir}: {e}") from None
        status, out, _ = self._exec(["config", "--get", "remote.origin.url"])
        current = out.decode().strip()
        if status != 0:
            self._run(["remote", "add", "origin", self._url], what="add remote")
        elif current != self._url:
            self._run(["remote", "set-url", "origin", self._url], what="set remote url")
        self._run(["config", "gc.auto", "0"], what="configure cache")  # no gc racing our readers
        self._repo = git.Repo(str(self.git_dir))
        return self._repo

    def _require_repo(self) -> git.Repo:
        if self._repo is None:
            if not (self.git_dir / "HEAD").exists():
                raise SourceError(f"{self._url} has not been fetched yet (call fetch() first)")
            self._ensure_repo()
        assert self._repo is not None
        return self._repo

    def _ref_sha(self, ref: str) -> str | None:
        status, out, _ = self._exec(["rev-parse", "--verify", "--quiet", ref])
        sha = out.decode().strip()
        return sha if status == 0 and is_sha(sha) else None

    def _cat_batch(self, names: Sequence[str]) -> list[bytes | None]:
        """Object contents for many names through one `git cat-file --batch` process."""
        if not names:
            return []
        payload = ("\n".join(names) + "\n").encode("utf-8", "surrogateescape")
        # --buffer: one write of the whole answer, not a flush per object (50,000 files: 0.21 -> 0.15 s)
        out = self._run(["cat-file", "--batch", "--buffer"], stdin=payload, what="read objects")
        results: list[bytes | None] = []
        pos = 0
        for name in names:
            eol = out.index(b"\n", pos)
            header = out[pos:eol].split(b" ")
            pos = eol + 1
            if header[-1] == b"missing" or header[-1] == b"ambiguous":
                results.append(None)
                continue
            if len(header) != 3:
                raise SourceError(f"unexpected cat-file answer for {name!r}: {header!r}")
            size = int(header[2])
            results.append(out[pos : pos + size] if header[1] == b"blob" else None)
            pos += size + 1
        return results

    def _env(self, network: bool) -> dict[str, str]:
        env = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "", "SSH_ASKPASS": "", "GIT_LITERAL_PATHSPECS": "1",
               **_IDENTITY}
        if not network:
            return env
        if self._basic:
            env.update(
                GIT_CONFIG_COUNT="1",
                GIT_CONFIG_KEY_0="http.extraHeader",
                GIT_CONFIG_VALUE_0=f"Authorization: Basic {self._basic}",
            )
        ssh = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=15", "-o", "StrictHostKeyChecking=accept-new"]
        if self._ssh_key_path is not None:
            ssh += ["-i", str(self._ssh_key_path), "-o", "IdentitiesOnly=yes"]
        env["GIT_SSH_COMMAND"] = shlex.join(ssh)
        return env

    def _exec(
        self, args: Sequence[str], *, stdin: bytes | None = None, network: bool = False
    ) -> tuple[int, bytes, str]:
        """Run git in the cache; (exit status, stdout, stderr). Never raises for a non-zero exit."""
        cmd = ["git", "--git-dir", str(self.git_dir), *args]
        env = self._env(network)
        timeout = self._network_timeout if network else None
        try:
            if stdin is None:
                status, out, err = self._git.execute(
                    cmd,
                    with_extended_output=True,
                    with_exceptions=False,
                    stdout_as_string=False,
                    strip_newline_in_stdout=False,
                    kill_after_timeout=timeout,
                    env=env,
                )
                assert isinstance(out, bytes)
                return int(status), out, str(err)
            handle = self._git.execute(cmd, as_process=True, istream=subprocess.PIPE, env=env)
            assert isinstance(handle, git.cmd.Git.AutoInterrupt) and handle.proc is not None
            proc = handle.proc
            try:
                out_b, err_b = proc.communicate(stdin, timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                return -9, b"", f"timed out after {timeout} s"
            return int(proc.returncode), out_b, err_b.decode(errors="replace")
        except git.GitCommandNotFound as e:
            raise SourceError(f"git is not installed or not runnable: {e}") from None

    def _run(
        self,
        args: Sequence[str],
        *,
        what: str,
        stdin: bytes | None = None,
        network: bool = False,
        ok_stderr: Sequence[str] = (),
    ) -> bytes:
        status, out, err = self._exec(args, stdin=stdin, network=network)
        if status == 0:
            return out
        if ok_stderr and any(s in err.lower() for s in ok_stderr):
            return b""
        raise self._classify(what, err, network=network, status=status)

    def _classify(self, what: str, stderr: str, *, network: bool = True, status: int | None = None) -> SourceError:
        text = stderr.strip() or f"exit status {status}"
        message = self._redact(f"git {what} failed: {text}")
        low = stderr.lower()
        if network and any(p in low for p in _AUTH_PATTERNS):
            return SourceAuthError(message)
        if network and (status == -9 or "timeout" in low or any(p in low for p in _UNREACHABLE_PATTERNS)):
            return SourceUnreachableError(message)
        return SourceError(message)

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            if secret:
                text = text.replace(secret, "***")
        return URL_USERINFO.sub(r"\1***@", text)

    # ---------------------------------------------------------------- writing a commit (rollback --write-commit)

    def commit_file(self, parent: str, path: str, data: bytes, message: str) -> str:
        """A new commit on top of `parent` whose tree differs only in `path` (written as `data`).

        Built in the object database (hash-object, mktree, commit-tree): no checkout, no index, so the
        mirror the daemon reads from is never disturbed. Returns the commit's sha (not pushed yet)."""
        with self._lock:
            self._require_repo()
            parent = self.resolve(parent)
            parts = [p for p in path.strip("/").split("/") if p]
            if not parts or any(p in (".", "..") for p in parts):
                raise SourceError(f"cannot write {path!r}: not a path inside the repository")
            blob = self._run(["hash-object", "-w", "--stdin"], stdin=data, what=f"store {path}").decode().strip()
            tree = self._run(["rev-parse", f"{parent}^{{tree}}"], what="read tree").decode().strip()
            new_tree = self._replace_in_tree(tree, parts, blob)
            return self._run(["commit-tree", new_tree, "-p", parent, "-F", "-"], stdin=message.encode(),
                             what="write commit").decode().strip()

    def _replace_in_tree(self, tree: str | None, parts: Sequence[str], blob: str) -> str:
        entries: list[bytes] = []
        if tree is not None:
            listing = self._run(["ls-tree", "-z", tree], what="list tree")
            entries = [e for e in listing.split(b"\0") if e]
        name = parts[0].encode("utf-8", "surrogateescape")
        kept: list[bytes] = []
        sub: str | None = None
        for e in entries:
            meta, _, entry_name = e.partition(b"\t")
            if entry_name != name:
                kept.append(e)
                continue
            mode, kind, sha = meta.split(b" ")
            if len(parts) > 1:
                if kind != b"tree":
                    raise SourceError(f"cannot write {'/'.join(parts)}: {parts[0]!r} is not a directory")
                sub = sha.decode()
            elif kind != b"blob" or mode not in (b"100644", b"100755"):
                raise SourceError(f"cannot write {parts[0]!r}: it is not a regular file in the repository")
        if len(parts) > 1:
            kept.append(b"040000 tree " + self._replace_in_tree(sub, parts[1:], blob).encode() + b"\t" + name)
        else:
            kept.append(b"100644 blob " + blob.encode() + b"\t" + name)
        body = b"".join(e + b"\0" for e in kept)
        return self._run(["mktree", "-z"], stdin=body, what="write tree").decode().strip()

    def push_commit(self, sha: str) -> None:
        """Publish `sha` as the new tip of the tracked branch, fast-forward only: a branch that moved
        meanwhile is never overwritten (SourceError: run again on the new tip).

        When origin is a local working copy with the branch checked out (the user's own checkout), the
        commit goes there only when that work tree is clean (SourceError naming the changed files
        otherwise), and its work tree and index are moved to the commit as `git merge --ff-only` would:
        git's own push-to-checkout (`receive.denyCurrentBranch=updateInstead`), given for this one push
        and never written to the repository's config."""
        with self._lock:
            self._require_repo()
            checkout = self.checkout_of_branch()
            receive: list[str] = []
            if checkout is not None:
                self._require_clean(checkout, sha)
                receive = ["--receive-pack", "git -c receive.denyCurrentBranch=updateInstead receive-pack"]
            status, out, err = self._exec(["push", "--porcelain", *receive, "origin",
                                           f"{sha}:refs/heads/{self.branch}"], network=True)
            if status != 0:
                if _lost_race(out, err):
                    raise SourceMovedError(f"branch {self.branch!r} on {self._url} moved while the commit was written; "
                                      "nothing was pushed: run the command again")
                raise self._classify(f"push to {self._url}", err)
            self._run(["update-ref", f"refs/heads/{self.branch}", sha], what="update the branch")

    def push_proposal(self, sha: str, branch: str) -> None:
        """Publish `sha` as branch `branch` on origin, for a pull request (the autoscaler's `commit.branch`). The
        branch is the proposer's own: a newer proposal replaces an older one (forced), but never the tracked
        branch."""
        if branch == self.branch:
            raise SourceError(f"a proposal branch cannot be the tracked branch {branch!r}")
        with self._lock:
            self._require_repo()
            status, _, err = self._exec(["push", "--porcelain", "origin", f"+{sha}:refs/heads/{branch}"], network=True)
            if status != 0:
                raise self._classify(f"push to {self._url}", err)

    def checkout_of_branch(self) -> Path | None:
        """The work tree that has the tracked branch checked out, when origin is a local non-bare
        repository (a user's own clone, or the README's demo repository); None otherwise."""
        if not self._is_local:
            return None
        path = unquote(urlsplit(self._url).path) if self._url.startswith("file://") else self._url
        status, out, _ = self._exec_in(Path(path), ["worktree", "list", "--porcelain"])  # no -z: git < 2.36
        if status != 0:
            return None
        for block in out.decode("utf-8", "surrogateescape").split("\n\n"):
            fields = dict(line.partition(" ")[::2] for line in block.splitlines() if line)
            if fields.get("branch") == f"refs/heads/{self.branch}" and "bare" not in fields and "worktree" in fields:
                return Path(fields["worktree"])
        return None

    def _require_clean(self, work_tree: Path, sha: str) -> None:
        """Refuse to move a checked-out branch over changes a user has not committed: tracked files that
        differ from HEAD (staged or not), and untracked files where the commit writes."""
        written = set(self._run(["diff-tree", "-r", "-z", "--name-only", "--no-commit-id", f"{sha}^", sha],
                                what="list the changed files").decode("utf-8", "surrogateescape").split("\0"))
        status, out, err = self._exec_in(work_tree, ["--no-optional-locks", "status", "--porcelain=v1", "-z",
                                                     "--untracked-files=all"])
        if status != 0:
            raise SourceError(f"cannot read the status of {work_tree}: {err.strip()}")
        dirty: list[str] = []
        entries = iter(out.decode("utf-8", "surrogateescape").split("\0"))
        for entry in entries:
            if not entry:
                continue
            code, name = entry[:2], entry[3:]
            if code[0] in "RC":
                next(entries, None)  # a rename's or copy's source path follows
            if code != "??" or name in written:
                dirty.append(f"{name} ({_CHANGE.get(code[1] if code[1] != ' ' else code[0], code.strip())})")
        if dirty:
            shown = ", ".join(dirty[:10]) + (f" and {len(dirty) - 10} more" if len(dirty) > 10 else "")
            raise SourceError(f"branch {self.branch!r} is checked out in {work_tree} and its work tree is not "
                              f"clean: {shown}; nothing was committed: commit or stash these changes, then run "
                              "the command again")

    def _exec_in(self, work: Path, args: Sequence[str]) -> tuple[int, bytes, str]:
        """Run git in the user's repository at `work` (not the cache); never raises for a non-zero exit."""
        try:
            status, out, err = self._git.execute(
                ["git", "-C", str(work), *args], with_extended_output=True, with_exceptions=False,
                stdout_as_string=False, strip_newline_in_stdout=False, env=self._env(False))
        except git.GitCommandNotFound as e:
            raise SourceError(f"git is not installed or not runnable: {e}") from None
        assert isinstance(out, bytes)
        return int(status), out, str(err)


_CHANGE = {"M": "modified", "T": "modified", "A": "added", "D": "deleted", "R": "renamed", "C": "copied",
           "U": "unmerged", "?": "untracked"}


__all__ = [
    "NOTES_REF",
    "CommitInfo",
    "FetchResult",
    "GitSource",
    "blob_sha",
    "cache_key",
    "redact_url",
]
