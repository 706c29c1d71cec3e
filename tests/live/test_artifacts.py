"""resolve_jar: repository paths, file://, local://, and http(s) downloads from a real loopback server."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.errors import PermanentStepError, TransientStepError
from reconciler.live.artifacts import resolve_jar

JAR = b"PK\x03\x04 not really a jar, but bytes with a checksum"
SHA = hashlib.sha256(JAR).hexdigest()


class Server:
    def __init__(self) -> None:
        self.hits: dict[str, int] = {}
        self.routes: dict[str, tuple[int, bytes]] = {
            "/jobs/counter.jar": (200, JAR),
            "/broken.jar": (500, b"disk on fire"),
            "/missing.jar": (404, b"no such jar"),
        }
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.hits[self.path] = outer.hits.get(self.path, 0) + 1
                status, body = outer.routes.get(self.path, (404, b""))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "jobs").mkdir(parents=True)
    (root / "jobs" / "counter.jar").write_bytes(JAR)
    (tmp_path / "outside.jar").write_bytes(JAR)
    return root


def test_repo_relative_path(repo: Path, tmp_path: Path) -> None:
    got = resolve_jar("jobs/counter.jar", repo_root=repo, cache_dir=tmp_path / "cache")
    assert got == (repo / "jobs" / "counter.jar").resolve()
    assert resolve_jar("./jobs/counter.jar", repo_root=repo, cache_dir=tmp_path, sha256=SHA) == got


def test_repo_escape_is_refused(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(PermanentStepError, match=r"leaves the repository"):
        resolve_jar("../outside.jar", repo_root=repo, cache_dir=tmp_path)
    (repo / "jobs" / "link.jar").symlink_to(tmp_path / "outside.jar")
    with pytest.raises(PermanentStepError, match="outside the repository"):
        resolve_jar("jobs/link.jar", repo_root=repo, cache_dir=tmp_path)


def test_relative_path_needs_a_repo(tmp_path: Path) -> None:
    with pytest.raises(PermanentStepError, match="no repository root"):
        resolve_jar("jobs/counter.jar", repo_root=None, cache_dir=tmp_path)


def test_file_uri_and_absolute_path(repo: Path, tmp_path: Path) -> None:
    jar = repo / "jobs" / "counter.jar"
    assert resolve_jar(jar.as_uri(), repo_root=None, cache_dir=tmp_path) == jar
    assert resolve_jar(str(jar), repo_root=repo, cache_dir=tmp_path) == jar
    with pytest.raises(PermanentStepError, match="does not exist"):
        resolve_jar((tmp_path / "nope.jar").as_uri(), repo_root=None, cache_dir=tmp_path)
    with pytest.raises(PermanentStepError, match="SHA-256"):
        resolve_jar(jar.as_uri(), repo_root=None, cache_dir=tmp_path, sha256="0" * 64)


def test_local_uri_is_inside_the_image(tmp_path: Path) -> None:
    assert resolve_jar("local:///opt/flink/usrlib/job.jar", repo_root=None, cache_dir=tmp_path) is None


def test_unknown_scheme(tmp_path: Path) -> None:
    with pytest.raises(PermanentStepError, match="unsupported scheme 's3'"):
        resolve_jar("s3://bucket/job.jar", repo_root=None, cache_dir=tmp_path)


def test_http_download_once_with_checksum(server: Server, tmp_path: Path) -> None:
    url = server.url + "/jobs/counter.jar"
    got = resolve_jar(url, repo_root=None, cache_dir=tmp_path / "cache", sha256=SHA)
    assert got is not None and got.read_bytes() == JAR and got.name == "counter.jar"
    again = resolve_jar(url, repo_root=None, cache_dir=tmp_path / "cache", sha256=SHA)
    assert again == got
    assert server.hits[url.removeprefix(server.url)] == 1, "a cached jar is not downloaded again"


def test_http_checksum_mismatch_is_permanent_and_leaves_nothing(server: Server, tmp_path: Path) -> None:
    with pytest.raises(PermanentStepError, match=f"downloaded SHA-256 is {SHA}"):
        resolve_jar(server.url + "/jobs/counter.jar", repo_root=None, cache_dir=tmp_path / "c", sha256="a" * 64)
    assert [p for p in (tmp_path / "c").rglob("*") if p.is_file()] == []


def test_http_errors_keep_the_servers_text(server: Server, tmp_path: Path) -> None:
    with pytest.raises(TransientStepError, match="HTTP 500: disk on fire"):
        resolve_jar(server.url + "/broken.jar", repo_root=None, cache_dir=tmp_path)
    with pytest.raises(PermanentStepError, match="HTTP 404: no such jar"):
        resolve_jar(server.url + "/missing.jar", repo_root=None, cache_dir=tmp_path)


def test_http_unreachable_is_transient(tmp_path: Path) -> None:
    s = Server()
    url = s.url + "/jobs/counter.jar"
    s.close()
    with pytest.raises(TransientStepError, match="ConnectError"):
        resolve_jar(url, repo_root=None, cache_dir=tmp_path, timeout=2)
