"""A real Git smart-HTTP server on loopback: `git http-backend` behind HTTP Basic auth.

This is what GitHub/GitLab/Gitea do for `https://` clones, minus TLS: git itself answers, so the
client side (GitSource) is exercised with the real protocol and real 401s.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def _backend() -> str:
    found = shutil.which("git-http-backend") or "/usr/lib/git-core/git-http-backend"
    if not Path(found).exists():
        out = subprocess.run(["git", "--exec-path"], capture_output=True, text=True, check=True).stdout.strip()
        found = str(Path(out) / "git-http-backend")
    return found


class GitHttpServer:
    """Serves every repo under `root` at http://127.0.0.1:<port>/<name>; needs user:token when set."""

    def __init__(self, root: Path, *, user: str | None = None, token: str | None = None) -> None:
        self.root = root
        self.expected = (
            "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode() if token is not None else None
        )
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def _serve(self) -> None:
                path, _, query = self.path.partition("?")
                if outer.expected is not None and self.headers.get("Authorization") != outer.expected:
                    outer.requests.append((self.command, path, 401))
                    body = b"Authentication required\n"
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="git"')
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                length = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(length) if length else b""
                env = {
                    "GIT_PROJECT_ROOT": str(outer.root),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "PATH_INFO": path,
                    "QUERY_STRING": query,
                    "REQUEST_METHOD": self.command,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(data)),
                    "REMOTE_USER": "tester",
                    "REMOTE_ADDR": "127.0.0.1",
                    "GIT_HTTP_MAX_REQUEST_BUFFER": "100M",
                    "PATH": "/usr/bin:/bin",
                }
                for key, value in self.headers.items():
                    env["HTTP_" + key.upper().replace("-", "_")] = value
                proc = subprocess.run([_backend()], input=data, capture_output=True, env=env, check=False)
                head, _, body = proc.stdout.partition(b"\r\n\r\n")
                status = 200
                headers: list[tuple[str, str]] = []
                for line in head.decode("latin-1").split("\r\n"):
                    if not line:
                        continue
                    k, _, v = line.partition(":")
                    if k.lower() == "status":
                        status = int(v.strip().split()[0])
                    else:
                        headers.append((k, v.strip()))
                outer.requests.append((self.command, path, status))
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

        return Handler

    def start(self) -> GitHttpServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def git_http_server(root: Path, *, user: str | None = None, token: str | None = None) -> Iterator[GitHttpServer]:
    server = GitHttpServer(root, user=user, token=token).start()
    try:
        yield server
    finally:
        server.stop()
