"""The GitOps certificate path for real: the API server calls the webhook with the CA given
as webhook.tls.caBundle, served from the user's own webhook.tls.existingSecret.

The test makes a CA and a serving certificate for the webhook Service's names, stores
them as a kubernetes.io/tls Secret, installs the chart with existingSecret and caBundle,
and runs the operator as a process with what the rendered Deployment gives its
container, under the operator ServiceAccount's token, with the files of the Secret the
Deployment mounts. As in test_packaging_install_with_operator, the operator listens on
the webhook Service's cluster IP and port (loopback, 127.254.0.0/24; no kube-proxy),
standing in for its one endpoint; that needs root, as `make test` runs.
"""

from __future__ import annotations

import base64
import datetime
import errno
import json
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes.client.exceptions import ApiException

from hack.cluster import Cluster
from hack.fake_thunder import FakeThunderProcess, start_fake_thunder
from hack.testbed.kube import Kube, wait_for
from hack.testbed.operator import API_TOKEN, THUNDER_API, OperatorProcess
from tests.integration.packaging.releasekit import helm as _helm
from tests.integration.packaging.releasekit import release_thundercluster, uninstall

CHART = "charts/thunder-device-plugin"
SECRET = "webhook-serving"
WEBHOOK_CERTS = "/tmp/k8s-webhook-server/serving-certs"


@dataclass
class Installed:
    release: str
    namespace: str
    fullname: str
    tc_name: str
    ca_bundle: str
    operator: OperatorProcess


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _serving(
    ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, service: str, namespace: str
) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    names = [service, f"{service}.{namespace}", f"{service}.{namespace}.svc"]
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[-1])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return _pem(cert), key_pem


def _can_bind(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as err:
            if err.errno in (errno.EACCES, errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                return False
            raise
    return True


def _token_kubeconfig(kube: Kube, cluster: Cluster, namespace: str, sa: str, path: Path) -> Path:
    request: Any = {"spec": {"expirationSeconds": 3600}}
    status = kube.core.create_namespaced_service_account_token(sa, namespace, request).status
    assert status is not None
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "local", "cluster": admin["clusters"][0]["cluster"]}],
                "users": [{"name": sa, "user": {"token": status.token}}],
                "contexts": [{"name": sa, "context": {"cluster": "local", "user": sa}}],
                "current-context": sa,
            }
        )
    )
    path.chmod(0o600)
    return path


def _message(err: ApiException) -> str:
    body = err.body.decode() if isinstance(err.body, bytes) else str(err.body)
    return str(json.loads(body).get("message", body))


def _by_hand() -> dict[str, Any]:
    return {
        "apiVersion": THUNDER_API,
        "kind": "ThunderCluster",
        "metadata": {"name": f"by-hand-{uuid.uuid4().hex[:6]}"},
        # Valid for the CRD's schema; only the webhook knows label keys and the singleton.
        "spec": {"daemon": {"nodeSelector": {"not a label key": "x"}}},
    }


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeThunderProcess]:
    log_path = tmp_path_factory.mktemp("fake-thunder") / "fake-thunder.log"
    with start_fake_thunder(tokens=[API_TOKEN], log_path=log_path) as process:
        yield process


@pytest.fixture(scope="module")
def installed(
    cluster: Cluster,
    kube: Kube,
    fake: FakeThunderProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Installed]:
    suffix = uuid.uuid4().hex[:6]
    release = namespace = f"tdw-{suffix}"
    fullname = f"{release}-thunder-device-plugin"
    tc_name = f"thunder-{suffix}"
    env = {**os.environ, **cluster.env()}
    work = tmp_path_factory.mktemp("webhook-existing-secret")
    ca, ca_key = _ca("gitops-test-ca")
    crt, key = _serving(ca, ca_key, f"{fullname}-webhook", namespace)
    ca_bundle = base64.b64encode(_pem(ca)).decode()

    ns_body: Any = {"metadata": {"name": namespace}}
    kube.core.create_namespace(ns_body)
    secrets: list[Any] = [
        {"metadata": {"name": "thunder-api"}, "stringData": {"THUNDER_API_TOKEN": API_TOKEN}},
        {
            "metadata": {"name": SECRET},
            "type": "kubernetes.io/tls",
            "data": {
                "tls.crt": base64.b64encode(crt).decode(),
                "tls.key": base64.b64encode(key).decode(),
                "ca.crt": ca_bundle,
            },
        },
    ]
    for secret in secrets:
        kube.core.create_namespaced_secret(namespace, secret)
    done = _helm(
        env, "install", release, CHART, "--namespace", namespace,
        "--set", f"thunderCluster.name={tc_name}",
        "--set", f"thunder.apiURL={fake.base_url}",
        "--set", f"thunder.artifactBaseURL={fake.artifact_base_url}",
        "--set", f"webhook.tls.existingSecret={SECRET}",
        "--set", f"webhook.tls.caBundle={ca_bundle}",
        check=False,
    )  # fmt: skip
    operator: OperatorProcess | None = None
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        manifest = _helm(env, "get", "manifest", release, "--namespace", namespace).stdout
        objects = [d for d in yaml.safe_load_all(manifest) if d]
        assert not [o for o in objects if o["kind"] == "Secret"]
        (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        mounted = volumes[mounts[WEBHOOK_CERTS]]["secret"]["secretName"]
        assert mounted == SECRET

        # The files of the Secret the Deployment mounts, where the Pod would see them.
        certs = work / "serving-certs"
        certs.mkdir()
        stored = kube.core.read_namespaced_secret(mounted, namespace)
        for name, value in (stored.data or {}).items():
            (certs / name).write_bytes(base64.b64decode(value))
        process_env: dict[str, str] = {}
        for item in container.get("env") or []:
            if "value" in item:
                process_env[item["name"]] = str(item["value"])
            else:
                field = item["valueFrom"]["fieldRef"]["fieldPath"]
                process_env[item["name"]] = {
                    "metadata.name": f"{deployment['metadata']['name']}-local",
                    "metadata.namespace": namespace,
                }[field]
        process_env["THUNDER_WEBHOOK_CERT_DIR"] = str(certs)
        service = kube.core.read_namespaced_service(f"{fullname}-webhook", namespace)
        assert service.spec is not None
        assert service.spec.ports is not None
        (port,) = service.spec.ports
        cluster_ip = str(service.spec.cluster_ip)
        if not _can_bind(cluster_ip, port.port):
            pytest.skip("the webhook Service's port cannot be bound here (module docstring)")
        process_env["THUNDER_WEBHOOK_LISTEN"] = cluster_ip
        process_env["THUNDER_WEBHOOK_PORT"] = str(port.port)

        kubeconfig = _token_kubeconfig(
            kube, cluster, namespace, pod["serviceAccountName"], work / "operator.kubeconfig"
        )
        operator = OperatorProcess(kubeconfig, container.get("args") or [], work)
        with pytest.MonkeyPatch.context() as patch:
            for name, value in process_env.items():
                patch.setenv(name, value)
            operator.start()
        yield Installed(release, namespace, fullname, tc_name, ca_bundle, operator)
    finally:
        release_thundercluster(kube, tc_name)
        if operator is not None:
            operator.stop()
        uninstall(env, kube, release, namespace, tc_name)
        kube.core.delete_namespace(namespace)


def _webhook_configuration(kube: Kube, installed: Installed) -> dict[str, Any]:
    name = f"{installed.fullname}-{installed.namespace}"[:63].rstrip("-")
    found = kube.get("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration", name)
    assert found is not None
    return found


def test_the_webhook_configuration_trusts_the_given_ca(installed: Installed, kube: Kube) -> None:
    config = _webhook_configuration(kube, installed)
    bundles = [w["clientConfig"]["caBundle"] for w in config["webhooks"]]
    assert bundles == [installed.ca_bundle] * 2


def _the_webhook_answers(kube: Kube) -> None:
    wanted = 'admission webhook "thunderclusters.thundercompute.com" denied the request'

    def denied() -> str | None:
        try:
            kube.create(_by_hand())
        except ApiException as err:
            message = _message(err)
            return message if wanted in message else None
        raise AssertionError("a ThunderCluster the webhook refuses was created")

    # Until the operator serves, the call fails (failurePolicy: Fail); then it answers.
    message = wait_for(denied, "the webhook's answer", timeout=90)
    assert "spec.daemon.nodeSelector" in message


def test_the_api_server_calls_the_webhook_over_that_ca(installed: Installed, kube: Kube) -> None:
    _the_webhook_answers(kube)


def test_another_ca_in_the_bundle_makes_the_call_fail(installed: Installed, kube: Kube) -> None:
    """The proof that the value is what the API server trusts: with another CA it cannot
    verify the operator's certificate, and with the value again it can."""
    other, _ = _ca("some-other-ca")
    config = _webhook_configuration(kube, installed)
    res = kube.resource("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration")

    def with_bundle(bundle: str) -> None:
        current = _webhook_configuration(kube, installed)
        for webhook in current["webhooks"]:
            webhook["clientConfig"]["caBundle"] = bundle
        res.replace(body=current)

    with_bundle(base64.b64encode(_pem(other)).decode())
    try:

        def refused() -> str | None:
            try:
                kube.create(_by_hand())
            except ApiException as err:
                message = _message(err)
                return message if "failed calling webhook" in message else None
            raise AssertionError("created without the webhook")

        message = wait_for(refused, "a webhook call the API server cannot verify", timeout=60)
        assert "certificate" in message, message
    finally:
        with_bundle(installed.ca_bundle)
    assert [w["clientConfig"]["caBundle"] for w in config["webhooks"]] == [installed.ca_bundle] * 2
    _the_webhook_answers(kube)
