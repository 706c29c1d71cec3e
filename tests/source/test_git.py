"""GitSource against real repositories: a bare origin on disk and a real smart-HTTP server on loopback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from reconciler.errors import SourceAuthError, SourceError, SourceUnreachableError
from reconciler.source.git import GitSource, blob_sha
from reconciler.spec.load import Unreadable
from tests.forges.git_http import git_http_server
from tests.source.gitrepo import Upstream, git


@pytest.fixture
def up(tmp_path: Path) -> Upstream:
    u = Upstream(tmp_path / "up")
    u.commit(
        {
            "apps/orders.yaml": "name: orders\nparallelism: 2\n",
            "apps/billing.yml": "name: billing\n",
            "apps/README.md": "not a spec\n",
            "apps/nested/deep.yaml": "name: deep\n",
            "other/ignored.yaml": "name: ignored\n",
            "apps-old/x.yaml": "name: sibling-prefix\n",
        },
        "first",
    )
    u.push()
    return u


def source(up: Upstream, tmp_path: Path, **kw: object) -> GitSource:
    return GitSource(str(up.origin), tmp_path / "cache", **kw)  # type: ignore[arg-type]


def test_first_fetch_clones_bare_and_reads_tree_without_checkout(up: Upstream, tmp_path: Path) -> None:
    src = source(up, tmp_path)
    result = src.fetch()
    assert result.old_sha is None
    assert result.new_sha == up.head()
    assert result.changed and not result.rewritten
    files = src.read_tree("main", "apps")
    assert files == {
        "apps/orders.yaml": b"name: orders\nparallelism: 2\n",
        "apps/billing.yml": b"name: billing\n",
        "apps/nested/deep.yaml": b"name: deep\n",
    }
    # A bare mirror: no file of the tree was written anywhere in the cache.
    cache_files = {p.name for p in (tmp_path / "cache").rglob("*")}
    assert "orders.yaml" not in cache_files
    assert git(src.git_dir, "rev-parse", "--is-bare-repository").strip() == "true"


def test_subdir_forms_and_suffix_filter(up: Upstream, tmp_path: Path) -> None:
    src = source(up, tmp_path)
    src.fetch()
    assert set(src.read_tree("main", "./apps/")) == set(src.read_tree("main", "apps"))
    assert set(src.read_tree("main", "apps/nested")) == {"apps/nested/deep.yaml"}
    assert "apps/README.md" in src.read_tree("main", "apps", suffixes=())
    everything = src.read_tree("main")
    assert {"other/ignored.yaml", "apps-old/x.yaml", "apps/orders.yaml"} <= set(everything)
    assert src.read_tree("main", "does-not-exist") == {}


def test_fetch_new_commits_and_read_old_revision(up: Upstream, tmp_path: Path) -> None:
    src = source(up, tmp_path)
    first = src.fetch().new_sha
    assert src.fetch().changed is False  # nothing new
    second = up.commit({"apps/orders.yaml": "name: orders\nparallelism: 4\n"}, "scale orders")
    up.push()
    result = src.fetch()
    assert (result.old_sha, result.new_sha, result.rewritten) == (first, second, False)
    assert src.read_tree(first, "apps")["apps/orders.yaml"] == b"name: orders\nparallelism: 2\n"
    assert src.read_tree("main", "apps")["apps/orders.yaml"] == b"name: orders\nparallelism: 4\n"


def test_force_push_is_detected_and_new_tip_wins(up: Upstream, tmp_path: Path) -> None:
    src = source(up, tmp_path)
    up.commit({"apps/orders.yaml": "name: orders\nparallelism: 8\n"}, "doomed")
    up.push()
    doomed = src.fetch().new_sha
    git(up.work, "reset", "-q", "--hard", "HEAD~1")
    rewritten = up.commit({"apps/billing.yml": "name: billing\nparallelism: 3\n"}, "rewritten")
    up.push(force=True)
    result = src.fetch()
    assert result.old_sha == doomed
    assert result.new_sha == rewritten
    assert result.rewritten is True
    assert src.resolve("main") == rewritten
    assert src.read_file("main", "apps/orders.yaml") == b"name: orders\nparallelism: 2\n"
    # A plain fast-forward afterwards is not a rewrite.
    up.commit({"apps/x.yaml": "name: x\n"})
    up.push()
    assert src.fetch().rewritten is False


def test_resolve_branches_tags_shas_and_relative(up: Upstream, tmp_path: Path) -> None:
    first = up.head()
    git(up.work, "tag", "v1")
    second = up.commit({"apps/billing.yml": "name: billing\nv: 2\n"})
    git(up.work, "push", "-q", "origin", "HEAD:refs/heads/main", "refs/tags/v1")
    git(up.work, "push", "-q", "origin", f"{first}:refs/heads/feature")
    src = source(up, tmp_path)
    src.fetch()
    assert src.resolve("main") == second
    assert src.resolve("HEAD") == second
    assert src.resolve("HEAD~1") == first
    assert src.resolve("main~1") == first
    assert src.resolve("v1") == first
    assert src.resolve("feature") == first
    assert src.resolve(first[:10]) == first
    assert src.resolve(second) == second
    with pytest.raises(SourceError, match="unknown revision 'no-such-branch'"):
        src.resolve("no-such-branch")
    with pytest.raises(SourceError, match="unknown revision"):
        src.resolve("0" * 40)
    with pytest.raises(SourceError, match="unknown revision '--output=/tmp/x'"):
        src.resolve("--output=/tmp/x")


def test_changed_paths_limited_to_subdir(up: Upstream, tmp_path: Path) -> None:
    a = up.head()
    up.commit(
        {
            "apps/orders.yaml": "name: orders\nparallelism: 3\n",
            "apps/billing.yml": None,
            "apps/new.yaml": "name: new\n",
            "other/ignored.yaml": "changed\n",
            "apps-old/x.yaml": "changed\n",
        }
    )
    git(up.work, "mv", "apps/nested/deep.yaml", "apps/deep.yaml")
    git(up.work, "commit", "-q", "-m", "rename")
    up.push()
    src = source(up, tmp_path)
    src.fetch()
    assert src.changed_paths(a, "main", "apps") == {
        "apps/orders.yaml",
        "apps/billing.yml",
        "apps/new.yaml",
        "apps/nested/deep.yaml",
        "apps/deep.yaml",
    }
    assert "other/ignored.yaml" in src.changed_paths(a, "main")
    assert src.changed_paths("main", "main", "apps") == set()


def test_read_paths_and_read_file(up: Upstream, tmp_path: Path) -> None:
    src = source(up, tmp_path)
    src.fetch()
    got = src.read_paths("main", ["apps/orders.yaml", "apps/gone.yaml", "apps/nested", "other/ignored.yaml"])
    assert got == {
        "apps/orders.yaml": b"name: orders\nparallelism: 2\n",
        "apps/gone.yaml": None,
        "apps/nested": Unreadable("is a directory, not a file"),  # there, but not a file
        "other/ignored.yaml": b"name: ignored\n",
    }
    with pytest.raises(SourceError, match=r"'apps/gone\.yaml' does not exist"):
        src.read_file("main", "apps/gone.yaml")


def test_binary_blob_roundtrip_and_materialize_once(up: Upstream, tmp_path: Path) -> None:
    jar = bytes(range(256)) * 4000 + b"\n\n\0tail"
    sha = up.commit({"jars/job.jar": jar, "apps/orders.yaml": "x: 1\n"})
    up.push()
    src = source(up, tmp_path)
    src.fetch()
    assert src.read_file(sha, "jars/job.jar") == jar
    assert src.read_tree(sha, "jars", suffixes=(".jar",)) == {"jars/job.jar": jar}
    dest = tmp_path / "jars"
    path = src.materialize(sha, "jars/job.jar", dest)
    assert path.read_bytes() == jar
    assert path.name.startswith(blob_sha(jar)[:16])
    mtime = path.stat().st_mtime_ns
    assert src.materialize("main", "jars/job.jar", dest) == path
    assert path.stat().st_mtime_ns == mtime
    assert [p.name for p in dest.iterdir()] == [path.name]
    with pytest.raises(SourceError, match="not a file"):
        src.materialize(sha, "apps", dest)
    # Read as a jarURI is: a path that normalises to the same file is that file, one above the root is none.
    for same in ("jars/./job.jar", "jars/sub/../job.jar", "./jars//job.jar"):
        assert src.materialize(sha, same, dest) == path, same
    with pytest.raises(SourceError, match=r"'jars/\.\./\.\./job\.jar' leaves the repository"):
        src.materialize(sha, "jars/../../job.jar", dest)


def test_commit_info(up: Upstream, tmp_path: Path) -> None:
    sha = up.commit({"apps/orders.yaml": "y: 1\n"}, "Scale orders to 4\n\nbody text")
    up.push()
    src = source(up, tmp_path)
    src.fetch()
    info = src.commit_info("main")
    assert info.sha == sha
    assert (info.author_name, info.author_email, info.subject) == ("Ada Author", "ada@example.com", "Scale orders to 4")
    assert info.time.tzinfo is not None


def test_working_copy_path_as_url(up: Upstream, tmp_path: Path) -> None:
    local = up.commit({"apps/local.yaml": "name: local\n"}, "not pushed")
    src = GitSource(str(up.work), tmp_path / "cache")
    assert src.fetch().new_sha == local
    assert "apps/local.yaml" in src.read_tree("main", "apps")
    # The working copy's checked-out commit, even on another branch or detached, is origin/HEAD.
    git(up.work, "checkout", "-q", "-b", "feature")
    feature = up.commit({"apps/feature.yaml": "name: feature\n"}, "feature work")
    src.fetch()
    assert src.resolve("origin/HEAD") == feature
    assert src.resolve("HEAD") == local  # HEAD is the tracked branch
    git(up.work, "checkout", "-q", "--detach", "HEAD~1")
    src.fetch()
    assert src.resolve("origin/HEAD") == local


def test_file_url_and_missing_branch(up: Upstream, tmp_path: Path) -> None:
    src = GitSource(up.origin.as_uri(), tmp_path / "c1")
    assert src.fetch().new_sha == up.head()
    with pytest.raises(SourceError, match="branch 'nope' does not exist"):
        GitSource(str(up.origin), tmp_path / "c2", branch="nope").fetch()


def test_read_before_fetch_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="has not been fetched"):
        GitSource(str(tmp_path / "x"), tmp_path / "cache").read_tree("main")


def test_unreachable_origins(tmp_path: Path) -> None:
    with pytest.raises(SourceUnreachableError, match="does not appear to be a git repository"):
        GitSource(str(tmp_path / "missing.git"), tmp_path / "c1").fetch()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: connection refused
    with pytest.raises(SourceUnreachableError):
        GitSource(f"http://127.0.0.1:{port}/repo.git", tmp_path / "c2", network_timeout=20).fetch()
    with pytest.raises(SourceUnreachableError):
        GitSource(f"ssh://git@127.0.0.1:{port}/repo.git", tmp_path / "c3", network_timeout=20).fetch()


def test_https_token_auth_against_real_smart_http(up: Upstream, tmp_path: Path) -> None:
    token = "ghp_s3cr3t-T0KEN-value"
    with git_http_server(up.root, user="x-access-token", token=token) as server:
        url = f"{server.url}/origin.git"
        good = GitSource(url, tmp_path / "good", token=token)
        assert good.fetch().new_sha == up.head()
        assert server.requests[-1][2] == 200

        with pytest.raises(SourceAuthError) as bad:
            GitSource(url, tmp_path / "bad", token="wrong-token").fetch()
        assert "wrong-token" not in str(bad.value)
        with pytest.raises(SourceAuthError) as none:
            GitSource(url, tmp_path / "none").fetch()
        assert "401" in str(none.value) or "Username" in str(none.value)

        # A password inside the URL is used as the token and never written to config or messages.
        in_url = GitSource(f"http://x-access-token:{token}@{url.removeprefix('http://')}", tmp_path / "inurl")
        in_url.fetch()
        assert token not in (in_url.git_dir / "config").read_text()
        assert token not in repr(in_url) and token not in in_url.url
        # The header travels in the environment, not in argv or config.
        assert token not in (good.git_dir / "config").read_text()


def test_notes_add_update_push_visible_in_other_clone(up: Upstream, tmp_path: Path) -> None:
    src = source(up, tmp_path)
    sha = src.fetch().new_sha
    src.add_note(sha, "flink-reconciler/orders", "flink-reconciler/orders: pending - planning")
    src.add_note(sha, "flink-reconciler/billing", "flink-reconciler/billing: success - applied, job RUNNING")
    src.add_note(sha, "flink-reconciler/orders", "flink-reconciler/orders: success - applied, job RUNNING")
    assert src.read_note(sha) == (
        "flink-reconciler/orders: success - applied, job RUNNING\n"
        "flink-reconciler/billing: success - applied, job RUNNING\n"
    )
    src.push_notes()

    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", str(up.origin), str(other))
    git(other, "fetch", "-q", "origin", "refs/notes/*:refs/notes/*")
    shown = git(other, "log", "-1", "--notes=flink-reconciler", "--format=%H%n%N")
    assert shown.strip().splitlines() == [
        sha,
        "flink-reconciler/orders: success - applied, job RUNNING",
        "flink-reconciler/billing: success - applied, job RUNNING",
    ]
    assert src.read_note("HEAD", "refs/notes/other") is None


def test_two_writers_do_not_clobber_each_other(up: Upstream, tmp_path: Path) -> None:
    a = GitSource(str(up.origin), tmp_path / "a")
    b = GitSource(str(up.origin), tmp_path / "b")
    sha = a.fetch().new_sha
    b.fetch()
    a.add_note(sha, "flink-reconciler/orders", "flink-reconciler/orders: success - a")
    b.add_note(sha, "flink-reconciler/billing", "flink-reconciler/billing: failure - b")
    a.push_notes()
    b.push_notes()  # diverged from origin's notes: rebased on them, not forced
    a.add_note(sha, "flink-reconciler/orders", "flink-reconciler/orders: success - a again")
    a.push_notes()
    remote = git(up.origin, "notes", "--ref=flink-reconciler", "show", sha)
    assert remote.splitlines() == [
        "flink-reconciler/orders: success - a again",
        "flink-reconciler/billing: failure - b",
    ]
    # Nothing new to push is a no-op, not an error.
    b.push_notes()
    b.push_notes()


def test_a_notes_push_that_loses_a_race_is_retried_in_place(up: Upstream, tmp_path: Path) -> None:
    """Another writer pushes between this writer's fetch of the notes and its push (a real race on the
    origin, set off by a git hook): the push is rejected (`fetch first`) and is retried at once on top of
    the other writer's notes, not failed back to the caller to retry a second later."""
    a = GitSource(str(up.origin), tmp_path / "a")
    b = GitSource(str(up.origin), tmp_path / "b")
    sha = a.fetch().new_sha
    b.fetch()
    a.add_note(sha, "flink-reconciler/orders", "flink-reconciler/orders: success - a")
    a.push_notes()
    a.add_note(sha, "flink-reconciler/orders", "flink-reconciler/orders: success - a again")  # not pushed yet
    b.add_note(sha, "flink-reconciler/billing", "flink-reconciler/billing: failure - b")
    # When b's fetch has stored origin's notes (not when it clears its copy), only the first time, a pushes.
    marker = tmp_path / "raced"
    hook = b.git_dir / "hooks" / "reference-transaction"
    hook.parent.mkdir(exist_ok=True)
    hook.write_text(f"""#!/bin/sh
[ "$1" = committed ] || exit 0
grep -v ' 0000000000000000000000000000000000000000 ' | grep -q ' refs/flink-reconciler/remote-notes/' || exit 0
[ -e {marker} ] && exit 0
touch {marker}
git --git-dir {a.git_dir} push -q origin refs/notes/flink-reconciler:refs/notes/flink-reconciler
""")
    hook.chmod(0o755)
    b.push_notes()
    assert marker.exists()  # the race did happen
    remote = git(up.origin, "notes", "--ref=flink-reconciler", "show", sha)
    assert remote.splitlines() == [
        "flink-reconciler/orders: success - a again",
        "flink-reconciler/billing: failure - b",
    ]


def test_read_notes_joins_a_commits_notes_from_the_shard_refs(up: Upstream, tmp_path: Path) -> None:
    """Sharded daemons each write `<ref>-shard-<i>`: a reconciler recovering lineage reads them all, and
    forgets a shard ref origin no longer has; a ref that merely starts like ours is not ours."""
    a = GitSource(str(up.origin), tmp_path / "a")
    sha = a.fetch().new_sha
    written = {"refs/notes/flink-reconciler": "flink-reconciler/orders: success - unsharded",
               "refs/notes/flink-reconciler-shard-1": "flink-reconciler/billing: success - shard 1",
               "refs/notes/flink-reconciler-shard-12": "flink-reconciler/deep: success - shard 12",
               "refs/notes/flink-reconciler-other": "flink-reconciler/deep: failure - not a shard's"}
    for ref, line in written.items():
        a.add_note(sha, line.split(":")[0], line, ref)
        a.push_notes(ref)
    b = GitSource(str(up.origin), tmp_path / "b")
    b.fetch()
    assert b.read_notes() == {sha: "flink-reconciler/orders: success - unsharded\n"
                                   "flink-reconciler/billing: success - shard 1\n"
                                   "flink-reconciler/deep: success - shard 12\n"}
    git(up.origin, "update-ref", "-d", "refs/notes/flink-reconciler-shard-1")
    git(up.origin, "update-ref", "-d", "refs/notes/flink-reconciler")
    assert b.read_notes() == {sha: "flink-reconciler/deep: success - shard 12\n"}
    # The writer's own unpushed lines count too, on top of origin's.
    a.add_note(sha, "flink-reconciler/x", "flink-reconciler/x: pending - local", "refs/notes/flink-reconciler-shard-3")
    assert a.read_notes()[sha].splitlines()[-1] == "flink-reconciler/x: pending - local"


def test_push_notes_to_unreachable_origin_keeps_lines_for_later(up: Upstream, tmp_path: Path) -> None:
    src = source(up, tmp_path)
    sha = src.fetch().new_sha
    src.add_note(sha, "k", "k: success - x")
    moved = up.root / "moved.git"
    up.origin.rename(moved)
    with pytest.raises(SourceUnreachableError):
        src.push_notes()
    moved.rename(up.origin)
    src.push_notes()
    assert git(up.origin, "notes", "--ref=flink-reconciler", "show", sha) == "k: success - x\n"


def test_a_token_as_the_url_user_name_is_used_and_never_shown(up: Upstream, tmp_path: Path) -> None:
    token = "ghp_user-n4me-T0KEN"
    with git_http_server(up.root, user="x-access-token", token=token) as server:
        url = f"{server.url}/origin.git"
        as_user = GitSource(url.replace("http://", f"http://{token}@"), tmp_path / "user")
        assert as_user.fetch().new_sha == up.head()
        assert token not in (as_user.git_dir / "config").read_text()
        assert token not in repr(as_user) and token not in as_user.url
        # A failing fetch names the origin without the token (the message reaches logs, /readyz, the / page).
        wrong = "ghp_wr0ng-T0KEN"
        with pytest.raises(SourceAuthError) as bad:
            GitSource(url.replace("http://", f"http://{wrong}@"), tmp_path / "wrong").fetch()
        assert wrong not in str(bad.value) and "origin.git" in str(bad.value)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SourceUnreachableError) as down:
        GitSource(f"https://{token}@127.0.0.1:{port}/repo.git", tmp_path / "down", network_timeout=20).fetch()
    assert token not in str(down.value) and f"127.0.0.1:{port}/repo.git" in str(down.value)


def test_a_cache_that_stored_a_token_in_its_url_is_cleaned(up: Upstream, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    GitSource(str(up.origin), cache).fetch()
    git(cache / "repo.git", "remote", "set-url", "origin", "https://ghp_old-T0KEN@example.invalid/x.git")
    GitSource(str(up.origin), cache).fetch()
    assert "ghp_old-T0KEN" not in (cache / "repo.git" / "config").read_text()


def test_a_relative_cache_dir_works_from_any_cwd(up: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    src = GitSource(str(up.origin), Path(".state/git"))
    assert src.fetch().new_sha == up.head()
    assert src.cache_dir == tmp_path / ".state/git"
    assert "apps/orders.yaml" in src.read_tree("main", "apps")


def test_symlinks_directories_and_odd_paths_are_unreadable_not_missing(up: Upstream, tmp_path: Path) -> None:
    (up.work / "apps").mkdir(exist_ok=True)
    (up.work / "apps/link.yaml").symlink_to("/etc/passwd")
    (up.work / "apps/dir.yaml").mkdir()
    (up.work / "apps/dir.yaml/inside.txt").write_text("x\n")
    (up.work / "apps/new\nline.yaml").write_text("name: nl\n")
    (up.work / "apps/star*.yaml").write_text("name: star\n")
    git(up.work, "add", "-A")
    git(up.work, "commit", "-q", "-m", "odd")
    up.push()
    src = source(up, tmp_path)
    src.fetch()
    tree = src.read_tree("main", "apps")
    assert tree["apps/link.yaml"] == Unreadable(
        "is a symbolic link; symlinks are not followed, a spec must be a regular file")
    assert tree["apps/dir.yaml"] == Unreadable("is a directory, not a file")
    assert isinstance(tree["apps/new\nline.yaml"], Unreadable) and "newline" in tree["apps/new\nline.yaml"].reason
    assert tree["apps/star*.yaml"] == b"name: star\n"
    assert tree["apps/orders.yaml"] == b"name: orders\nparallelism: 2\n"
    # The incremental read (the daemon) agrees, one path at a time or many; a glob is a literal name.
    paths = ["apps/link.yaml", "apps/dir.yaml", "apps/new\nline.yaml", "apps/star*.yaml", "apps/gone.yaml"]
    assert src.read_paths("main", paths) == {p: tree.get(p) for p in paths}
    assert src.read_paths("main", ["apps/*.yaml"]) == {"apps/*.yaml": None}
    assert src.changed_paths("HEAD~1", "main", "apps") >= {"apps/link.yaml", "apps/new\nline.yaml"}
    with pytest.raises(SourceError, match="symbolic link"):
        src.read_file("main", "apps/link.yaml")
    with pytest.raises(SourceError, match="symbolic link"):
        src.materialize("main", "apps/link.yaml", tmp_path / "jars")
