"""Artifact integrity through the real daemon: pinned installer and library digests
(``--installer-sha256``, ``--library-sha256``, from the ThunderCluster), and https that
stays https across redirects. A refusal names the URL and both digests, mints nothing,
runs no installer and stages nothing."""

from __future__ import annotations

import hashlib
import http.server
import ssl
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from hack.cluster.pki import CertificateAuthority
from hack.fake_thunder import LIBRARY_SHA256, FakeThunderProcess
from hack.testbed.daemon import (
    DaemonProcess,
    NodeHarness,
    Workloads,
    ZonePool,
    files_under,
    mints,
)
from hack.testbed.kube import Kube, wait_for

GPUS = ["NVIDIA RTX A6000"] * 4
WRONG = "0123456789abcdef" * 4


@pytest.fixture(scope="module")
def pods(kube: Kube, namespace: str, pool: ZonePool) -> Workloads:
    return Workloads(kube, namespace, pool)


def _installer_sha256(fake: FakeThunderProcess) -> str:
    with urllib.request.urlopen(fake.installer_url, timeout=10) as response:
        return hashlib.sha256(response.read()).hexdigest()


def _kubelet_error(node: NodeHarness, claim_hint: str, text: str) -> str:
    def found() -> str | None:
        for error in node.kubelet.errors:
            if claim_hint in error and text in error:
                return error
        return None

    return wait_for(found, f"a prepare error with {text!r}", timeout=60)


def _assert_nothing_staged(node: NodeHarness, claim_uid: str) -> None:
    state = node.daemon.state_dir
    assert not list(files_under(node.daemon.cdi_dir))
    assert not (state / "claims" / claim_uid).exists()
    assert not list(files_under(state / "libthunder"))


def _refused_prepare(
    node: NodeHarness, pods: Workloads, fake: FakeThunderProcess, text: str
) -> str:
    writes_before = len(fake.admin.writes())
    name, _ = pods.create(node)
    claim_name, claim_uid = pods.claim_of(name)
    error = _kubelet_error(node, f"claim {pods.namespace}/{claim_name}: ", text)
    assert mints(fake, writes_before) == []
    _assert_nothing_staged(node, claim_uid)
    pods.delete(name)
    pods.wait_gone(node, name)
    return error


def test_a_library_pin_that_the_installer_does_not_match_refuses_the_claim(
    kube: Kube, fake: FakeThunderProcess, pool: ZonePool, pods: Workloads
) -> None:
    with NodeHarness(kube, fake, zone=pool.zone, extra_args=["--library-sha256", WRONG]) as node:
        node.daemon.start().wait_serving()
        error = _refused_prepare(node, pods, fake, "libthunder.so refused")
        assert fake.installer_url in error
        assert LIBRARY_SHA256 in error
        assert WRONG in error
        assert [d["path"] for d in fake.admin.downloads()].count("/artifacts/libthunder.so") == 0
    assert fake.admin.leaks() == []


def test_an_installer_with_another_digest_is_refused_for_claims_and_the_node_install(
    kube: Kube, fake: FakeThunderProcess, pool: ZonePool, pods: Workloads
) -> None:
    actual = _installer_sha256(fake)
    writes_before = len(fake.admin.writes())
    with NodeHarness(
        kube, fake, zone=pool.zone, serving=True, extra_args=["--installer-sha256", WRONG]
    ) as node:
        node.daemon.host.set_nvidia(gpus=GPUS)
        node.daemon.start().wait_serving()

        def refused() -> str | None:
            status, body = node.daemon.http("/readyz")
            return body if status == 503 and "installer was refused" in body else None

        body = wait_for(refused, "the node install refused", timeout=60)
        assert fake.installer_url in body
        assert actual in body
        assert WRONG in body
        # Nothing was minted for it and nothing ran on the host.
        assert mints(fake, writes_before, role="server") == []
        assert node.daemon.host.installs() == []
        assert node.daemon.host.thunder()["installed"] is False

        error = _refused_prepare(node, pods, fake, "libthunder.so refused")
        assert fake.installer_url in error
        assert actual in error
        assert WRONG in error
    assert fake.admin.leaks() == []


def test_matching_pins_enroll_the_node_and_prepare_claims(
    kube: Kube, fake: FakeThunderProcess, pool: ZonePool, pods: Workloads
) -> None:
    pins = ["--installer-sha256", _installer_sha256(fake), "--library-sha256", LIBRARY_SHA256]
    with NodeHarness(kube, fake, zone=pool.zone, serving=True, extra_args=pins) as node:
        node.daemon.host.set_nvidia(gpus=GPUS)
        node.daemon.start().wait_serving()
        wait_for(lambda: node.daemon.http("/readyz")[0] == 200, "enrolled", timeout=90)
        name, _ = pods.create(node)
        pods.wait_running(node, name)
        library = node.daemon.state_dir / "libthunder" / "sha256" / LIBRARY_SHA256
        assert (library / "libthunder.so").is_file()
        pods.delete(name)
        pods.wait_gone(node, name)
    assert fake.admin.leaks() == []


class _Redirector(http.server.BaseHTTPRequestHandler):
    target = ""

    def do_GET(self) -> None:
        self.send_response(302)
        self.send_header("Location", self.target + self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def https_redirector(fake: FakeThunderProcess, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An https server on loopback whose every answer redirects to the fake's plain http
    URL; yields its base URL and the CA file that verifies it."""
    authority = CertificateAuthority(tmp_path)
    pair = authority.issue("redirector", "127.0.0.1", ip_addresses=("127.0.0.1",), server=True)
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(authority.pem)
    handler = type("Handler", (_Redirector,), {"target": fake.base_url})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pair.cert, pair.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", ca_file
    finally:
        server.shutdown()
        server.server_close()


class _TrustingDaemon(DaemonProcess):
    """The daemon with a test CA in ``SSL_CERT_FILE`` (set through ``env`` in its argv)."""

    ca_file: Path

    def args(self) -> list[str]:
        command = super().args()
        assert command[0] == sys.executable
        return ["/usr/bin/env", f"SSL_CERT_FILE={self.ca_file}", *command]


def test_an_https_artifact_url_that_redirects_to_http_is_refused(
    kube: Kube,
    fake: FakeThunderProcess,
    pool: ZonePool,
    pods: Workloads,
    https_redirector: tuple[str, Path],
) -> None:
    base, ca_file = https_redirector
    with NodeHarness(kube, fake, zone=pool.zone) as node:
        daemon = _TrustingDaemon(
            node=node.name,
            kubeconfig=kube.kubeconfig,
            fake=fake,
            root=node.root,
            instance_id=node.daemon.instance_id,
            extra_args=["--artifact-base-url", f"{base}/artifacts"],
        )
        daemon.ca_file = ca_file
        node.daemon = daemon
        downloads_before = len(fake.admin.downloads())
        daemon.start().wait_serving()
        error = _refused_prepare(node, pods, fake, "must not continue over plain http")
        assert f"{base}/artifacts/install.sh" in error
        assert f"{fake.base_url}/artifacts/install.sh" in error
        # The refusal came before any plain-http request was sent.
        assert fake.admin.downloads()[downloads_before:] == []


def test_a_plain_http_artifact_base_that_is_not_loopback_is_refused_at_start(
    kube: Kube, fake: FakeThunderProcess, pool: ZonePool
) -> None:
    with NodeHarness(
        kube, fake, zone=pool.zone, extra_args=["--artifact-base-url", "http://get.example.test"]
    ) as node:
        assert node.daemon.start().wait_exit() == 2
        assert "--artifact-base-url" in node.daemon.log_text()
        assert "must use https" in node.daemon.log_text()
