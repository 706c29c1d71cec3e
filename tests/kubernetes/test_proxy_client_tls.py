"""Flink's REST API through the API server's service proxy with a kubeconfig that logs in with a client
certificate (kind's, kubeadm's, the node lab's): the proxy client must present the certificate.

Found on a real node: httpx ignores `cert=` when `verify` is a CA path, so every proxied Flink call went out
anonymous (`403 ... User "system:anonymous" cannot get resource "services/proxy"`), while the stand-in (no
TLS) and token kubeconfigs hid it. Here a loopback TLS server that requires a client certificate signed by
its CA plays the API server.
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from kubernetes import client as k8s_client

from reconciler.clock import SystemClock
from reconciler.live.kubernetes.runtime import KubernetesRuntime

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-new", "-nodes", "-newkey", "rsa:2048", "-keyout", str(d / "ca.key"),
             "-out", str(d / "ca.crt"), "-days", "1", "-subj", "/CN=test-ca")
    for name, subj, ext in (("server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
                            ("client", "/O=system:masters/CN=admin", "extendedKeyUsage=clientAuth")):
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / f"{name}.key"),
                 "-subj", subj, "-out", str(d / f"{name}.csr"))
        _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.crt"), "-CAkey", str(d / "ca.key"),
                 "-CAcreateserial", "-days", "1", "-extfile", str(d / f"{name}.ext"), "-out", str(d / f"{name}.crt"))
    return d


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        peer = self.connection.getpeercert()
        subject = dict(x[0] for x in (peer or {}).get("subject", ()))
        body = json.dumps({"user": subject.get("commonName", "system:anonymous"), "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def api_server(pki: Path) -> Iterator[str]:
    """HTTPS on loopback that refuses a handshake without a client certificate from its CA."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki / "server.crt", pki / "server.key")
    ctx.load_verify_locations(pki / "ca.crt")
    ctx.verify_mode = ssl.CERT_REQUIRED
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"https://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def _runtime(host: str, pki: Path) -> KubernetesRuntime:
    cfg = k8s_client.Configuration()
    cfg.host = host
    cfg.ssl_ca_cert = str(pki / "ca.crt")
    cfg.cert_file = str(pki / "client.crt")
    cfg.key_file = str(pki / "client.key")
    return KubernetesRuntime(k8s_client.ApiClient(cfg), clock=SystemClock(), namespaces=["ns"], rest_via="proxy")


def test_the_proxy_client_presents_the_kubeconfigs_client_certificate(api_server: str, pki: Path) -> None:
    rt = _runtime(api_server, pki)
    url = f"{api_server}/api/v1/namespaces/ns/services/app-rest:8081/proxy/jobs/overview"
    resp = rt._proxy_client().get(url)
    assert resp.json() == {"user": "admin", "path": "/api/v1/namespaces/ns/services/app-rest:8081/proxy/jobs/overview"}


def test_flink_calls_through_the_proxy_authenticate(api_server: str, pki: Path) -> None:
    """The path every Flink REST call of the runtime takes (rest_via=proxy)."""
    rt = _runtime(api_server, pki)
    client = rt._rest_client(f"{api_server}/api/v1/namespaces/ns/services/app-rest:8081/proxy")
    assert client._json("GET", "/overview")["user"] == "admin"


def test_the_server_certificate_is_still_verified(api_server: str, pki: Path, tmp_path: Path) -> None:
    """Presenting a certificate must not loosen verification: another CA's server is refused."""
    other = tmp_path / "other-ca.crt"
    _openssl("req", "-x509", "-new", "-nodes", "-newkey", "rsa:2048", "-keyout", str(tmp_path / "o.key"),
             "-out", str(other), "-days", "1", "-subj", "/CN=other-ca")
    rt = _runtime(api_server, pki)
    rt.kube.api_client.configuration.ssl_ca_cert = str(other)
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        rt._proxy_client().get(f"{api_server}/x")
