"""The operator's validating webhook, registered with the local API server.

The operator serves it over TLS with a self-signed certificate whose CA it writes out;
the test registers a ValidatingWebhookConfiguration pointing at it (by URL, with that
CA) for objects carrying this module's label only, so nothing else in the shared
cluster is affected. Rejections are checked as a user sees them: through
`kubectl apply` and through the API.
"""

from __future__ import annotations

import base64
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from hack.cluster import Cluster, free_port
from hack.fake_thunder import FakeThunderProcess
from hack.testbed.kube import Kube, wait_for
from hack.testbed.operator import THUNDER_API, OperatorEnv, operator_env

TEST_LABEL = "thunder-test/webhook"


@pytest.fixture(scope="module")
def label_value() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def webhook_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def ca_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("webhook") / "ca.crt"


@pytest.fixture(scope="module")
def env(
    kube: Kube,
    cluster: Cluster,
    fake_thunder: FakeThunderProcess,
    tmp_path_factory: pytest.TempPathFactory,
    label_value: str,
    webhook_port: int,
    ca_path: Path,
) -> Iterator[OperatorEnv]:
    args = [
        "--webhook-port",
        str(webhook_port),
        "--webhook-listen",
        "127.0.0.1",
        "--webhook-host",
        "127.0.0.1",
        "--webhook-ca-dump",
        str(ca_path),
    ]
    with operator_env(
        kube,
        cluster,
        fake_thunder,
        tmp_path_factory.mktemp("operator"),
        extra_args=args,
        labels={TEST_LABEL: label_value},
    ) as made:
        yield made


def _webhook(
    name: str, path: str, resource: str, scope: str, port: int, ca: bytes, label: str
) -> dict[str, Any]:
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "timeoutSeconds": 10,
        "clientConfig": {
            "url": f"https://127.0.0.1:{port}{path}",
            "caBundle": base64.b64encode(ca).decode(),
        },
        "rules": [
            {
                "apiGroups": ["thundercompute.com"],
                "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": [resource],
                "scope": scope,
            }
        ],
        "objectSelector": {"matchLabels": {TEST_LABEL: label}},
    }


@pytest.fixture(scope="module")
def registered(
    env: OperatorEnv, webhook_port: int, ca_path: Path, label_value: str
) -> Iterator[str]:
    """The ValidatingWebhookConfiguration, for this module's labelled objects only."""

    def dumped() -> bytes | None:
        return ca_path.read_bytes() if ca_path.is_file() else None

    ca = wait_for(dumped, "the webhook CA dump")
    name = f"thunder-test-{label_value}"
    api = k8s.AdmissionregistrationV1Api(env.kube.api_client)
    body: Any = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            _webhook(
                "thunderclusters.thundercompute.com",
                "/validate-thundercluster",
                "thunderclusters",
                "Cluster",
                webhook_port,
                ca,
                label_value,
            ),
            _webhook(
                "clients.thundercompute.com",
                "/validate-client",
                "clients",
                "Namespaced",
                webhook_port,
                ca,
                label_value,
            ),
        ],
    }
    api.create_validating_webhook_configuration(body)
    try:
        yield name
    finally:
        api.delete_validating_webhook_configuration(name)


def kubectl_apply(env: OperatorEnv, manifest: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    kubectl = env.cluster.bin_dir / "kubectl"
    return subprocess.run(
        [str(kubectl), "--kubeconfig", str(env.cluster.kubeconfig), "apply", "-f", "-"],
        input=yaml.safe_dump(manifest),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def rejection(call: Any) -> str:
    with pytest.raises(k8s.ApiException) as caught:
        call()
    assert caught.value.status == 422, caught.value.body
    return str(caught.value.body)


def test_kubectl_apply_of_a_bad_second_thundercluster_is_refused(
    env: OperatorEnv, registered: str, label_value: str
) -> None:
    name = f"second-{label_value}"
    manifest: dict[str, Any] = {
        "apiVersion": THUNDER_API,
        "kind": "ThunderCluster",
        "metadata": {"name": name, "labels": {TEST_LABEL: label_value}},
        "spec": {"operator": {"reconcileInterval": "1s", "orphanGracePeriod": "10s"}},
    }
    # Out-of-range durations are refused by the CRD's own rules, webhook or not.
    result = kubectl_apply(env, manifest)
    assert result.returncode != 0
    message = result.stderr
    assert 'spec.operator.reconcileInterval: Invalid value: "1s": must be between 5s and 24h' in (
        message
    ), message
    assert (
        'spec.operator.orphanGracePeriod: Invalid value: "10s": must be between 30s and 168h'
        in (message)
    ), message

    # What only the webhook can judge: label keys and the one-per-cluster rule.
    manifest["spec"] = {"daemon": {"nodeSelector": {"not a label key": "x"}}}
    result = kubectl_apply(env, manifest)
    assert result.returncode != 0
    message = result.stderr
    assert 'admission webhook "thunderclusters.thundercompute.com" denied the request' in message
    assert 'keys must be label keys such as example.com/name, got "not a label key"' in message
    only_one = f'only one ThunderCluster may exist per cluster, and "{env.name}" already does'
    assert f"metadata.name: {only_one}" in message
    assert env.kube.get(THUNDER_API, "ThunderCluster", name) is None


def test_naming_settings_are_immutable_once_published(env: OperatorEnv, registered: str) -> None:
    env.add_zone(env.zone("hook"), [("A6000", 1)])
    env.sync()
    assert env.slices()
    body = rejection(
        lambda: env.patch_thundercluster(
            {"spec": {"operator": {"deviceClassPrefix": "other-", "driverName": "gpu.example.com"}}}
        )
    )
    assert (
        "spec.operator.deviceClassPrefix: is immutable once ResourceSlices or DeviceClasses are "
        'published, was \\"thunder-gpu-\\", got \\"other-\\"' in body
    )
    assert "spec.operator.driverName: is immutable" in body
    # Other settings may change, and metadata-only updates always pass.
    env.patch_thundercluster({"spec": {"operator": {"reconcileInterval": "45s"}}})
    env.patch_thundercluster({"metadata": {"annotations": {"example.com/note": "ok"}}})
    assert env.thundercluster()["spec"]["operator"]["reconcileInterval"] == "45s"


def test_client_spec_is_immutable(env: OperatorEnv, registered: str, label_value: str) -> None:
    objects = k8s.CustomObjectsApi(env.kube.api_client)
    with env.kube.namespace("hook-client") as ns:
        body = {
            "apiVersion": THUNDER_API,
            "kind": "Client",
            "metadata": {"name": "claim-record", "labels": {TEST_LABEL: label_value}},
            "spec": {
                "claim": {"namespace": ns, "name": "gpu", "uid": str(uuid.uuid4())},
                "nodeName": "node-a",
                "zone": {"name": "us-east", "id": "zone-1"},
                "gpuType": "A6000",
                "gpuCount": 1,
            },
        }
        objects.create_namespaced_custom_object(
            "thundercompute.com", "v1alpha1", ns, "clients", body
        )

        def patch(spec: dict[str, Any]) -> None:
            objects.patch_namespaced_custom_object(
                "thundercompute.com", "v1alpha1", ns, "clients", "claim-record", {"spec": spec}
            )

        # The CRD's CEL rules refuse these before any webhook is asked.
        message = rejection(lambda: patch({"gpuCount": 2, "zone": {"name": "eu", "id": "zone-2"}}))
        assert '"field":"spec.gpuCount"' in message, message
        assert "gpuCount is immutable" in message
        assert "zone is immutable" in message

        patch({"enrollmentTokenId": "et-first"})  # may be set once
        message = rejection(lambda: patch({"enrollmentTokenId": "et-second"}))
        assert "enrollmentTokenId may be set once and then never change" in message, message
