"""`helm install` of the chart into the local control plane: one step, webhook enabled.

There is no kubelet, so the operator Pod never runs: the test checks what the chart
creates, that the API server accepts the chart's own ThunderCluster although nothing
serves the webhook yet, and that the webhook still guards every other write.

Safety: the local control plane's Service IPs are not routable here, and the API
server would dial a webhook Service's cluster IP. Right after the install the test
deletes the webhook Service, so every webhook call fails inside the API server
("service not found") instead of leaving the machine.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from hack.cluster import Cluster
from hack.testbed.kube import Kube, wait_for
from ops import helm_test
from tests.integration.packaging.releasekit import helm as _helm

CHART = "charts/thunder-device-plugin"
GROUP = "thundercompute.com/v1alpha1"


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    cluster_name: str
    env: dict[str, str]
    install_output: str

    @property
    def fullname(self) -> str:
        return f"{self.name}-thunder-device-plugin"


def _message(err: ApiException) -> str:
    body = err.body.decode() if isinstance(err.body, bytes) else str(err.body)
    return str(json.loads(body).get("message", body))


@pytest.fixture(scope="module")
def release(cluster: Cluster, kube: Kube) -> Iterator[Release]:
    suffix = uuid.uuid4().hex[:6]
    namespace, name = f"tdp-{suffix}", f"tdp-{suffix}"
    env = {**os.environ, **cluster.env()}
    ns_body: Any = {"metadata": {"name": namespace}}
    secret: Any = {
        "metadata": {"name": "thunder-api"},
        "stringData": {"THUNDER_API_TOKEN": "not-a-real-token"},
    }
    kube.core.create_namespace(ns_body)
    kube.core.create_namespaced_secret(namespace, secret)
    cluster_name = f"thunder-{suffix}"
    done = _helm(
        env,
        "install",
        name,
        CHART,
        "--namespace",
        namespace,
        "--set",
        f"thunderCluster.name={cluster_name}",
        check=False,
    )
    try:
        if done.returncode == 0:
            # See the module docstring: no webhook call may reach a cluster IP.
            kube.core.delete_namespaced_service(f"{name}-thunder-device-plugin-webhook", namespace)
        yield Release(name, namespace, cluster_name, env, done.stdout + done.stderr)
    finally:
        # --no-hooks: no kubelet runs the chart's pre-delete Job here (it is tested in
        # test_packaging_uninstall_hook by running its script).
        _helm(env, "uninstall", name, "--namespace", namespace, "--wait", "--no-hooks", check=False)
        kube.core.delete_namespace(namespace)


def test_install_succeeds_in_one_step_with_the_webhook_enabled(
    release: Release, kube: Kube
) -> None:
    assert "STATUS: deployed" in release.install_output, release.install_output
    tc = kube.get(GROUP, "ThunderCluster", release.cluster_name)
    assert tc is not None
    # The API server filled in the CRD defaults the chart did not set.
    assert tc["spec"]["daemon"]["thunderdPortRange"] == {"start": 32000, "end": 32199}
    assert tc["spec"]["thunder"]["secretNamespace"] == release.namespace
    hook = kube.get(
        "admissionregistration.k8s.io/v1",
        "ValidatingWebhookConfiguration",
        f"{release.fullname}-{release.namespace}",
    )
    assert hook is not None
    assert {w["failurePolicy"] for w in hook["webhooks"]} == {"Fail"}


def test_every_object_of_the_chart_exists(release: Release, kube: Kube) -> None:
    manifest = _helm(
        release.env, "get", "manifest", release.name, "--namespace", release.namespace
    ).stdout
    objects = [d for d in yaml.safe_load_all(manifest) if d]
    assert len(objects) >= 13
    missing = []
    for obj in objects:
        ns = obj["metadata"].get("namespace")
        if obj["kind"] == "Service" and obj["metadata"]["name"].endswith("-webhook"):
            continue  # deleted on purpose by the fixture
        if kube.get(obj["apiVersion"], obj["kind"], obj["metadata"]["name"], ns) is None:
            missing.append(f"{obj['kind']}/{obj['metadata']['name']}")
    assert missing == []


def test_the_webhook_still_guards_everything_else(release: Release, kube: Kube) -> None:
    other: dict[str, Any] = {
        "apiVersion": GROUP,
        "kind": "ThunderCluster",
        "metadata": {"name": f"by-hand-{uuid.uuid4().hex[:6]}"},
        "spec": {},
    }
    with pytest.raises(ApiException) as caught:
        kube.create(other)
    assert 'failed calling webhook "thunderclusters.thundercompute.com"' in _message(caught.value)
    # A hand-made object that claims to be Helm's, by a user allowed to create
    # ThunderClusters but not to remove the webhook, is validated too.
    editor = f"tc-editor-{uuid.uuid4().hex[:6]}"
    rbac: list[Any] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": editor, "namespace": release.namespace},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": editor},
            "rules": [
                {
                    "apiGroups": ["thundercompute.com"],
                    "resources": ["thunderclusters"],
                    "verbs": ["get", "create"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": editor},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": editor,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": editor, "namespace": release.namespace}
            ],
        },
    ]
    for obj in rbac:
        kube.create(obj)
    try:
        other["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "Helm"}
        done = subprocess.run(
            [
                "kubectl",
                f"--as=system:serviceaccount:{release.namespace}:{editor}",
                "create",
                "-f",
                "-",
            ],
            input=yaml.safe_dump(other),
            env=release.env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode != 0
        assert 'failed calling webhook "thunderclusters.thundercompute.com"' in done.stderr
    finally:
        kube.delete("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", editor)
        kube.delete("rbac.authorization.k8s.io/v1", "ClusterRole", editor)


def _client(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": GROUP,
        "kind": "Client",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "claim": {"namespace": namespace, "name": "c", "uid": "u-1"},
            "nodeName": "n1",
            "zone": {"name": "z", "id": "z1"},
            "gpuType": "A6000",
            "gpuCount": 1,
        },
    }


def test_client_writes_by_the_daemon_skip_the_webhook_and_others_are_refused(
    release: Release, kube: Kube
) -> None:
    # The daemon as its Pod's token shows it: the ServiceAccount, with its node's name.
    api = k8s_config.new_client_from_config(config_file=release.env["KUBECONFIG"])  # type: ignore[no-untyped-call]
    sa = f"system:serviceaccount:{release.namespace}:{release.fullname}-daemon"
    api.set_default_header("Impersonate-User", sa)
    api.set_default_header("Impersonate-Extra-authentication.kubernetes.io%2fnode-name", "n1")
    body = _client(f"c-{uuid.uuid4().hex[:6]}", release.namespace)
    k8s.CustomObjectsApi(api).create_namespaced_custom_object(
        "thundercompute.com", "v1alpha1", release.namespace, "clients", body
    )
    kube.delete(GROUP, "Client", body["metadata"]["name"], release.namespace)
    # Anyone else, the administrator included, is refused by the chart's admission
    # policy, before (and whether or not) the webhook is called.
    body["metadata"]["name"] += "-admin"

    def refused() -> ApiException | None:
        # The apiserver starts enforcing a new policy shortly after it is created; until
        # then the request reaches the (unserved) webhook and fails with a 500.
        try:
            kube.create(body)
        except ApiException as err:
            return err if err.status == 403 else None
        kube.delete(GROUP, "Client", body["metadata"]["name"], release.namespace)
        raise AssertionError("the administrator created a Client")

    caught = wait_for(refused, "the admission policy refusing the administrator's Client")
    assert "Clients are written only by the driver" in _message(caught)


@pytest.mark.parametrize(
    ("who", "verb", "resource", "namespace", "allowed"),
    [
        ("daemon", "create", "resourceslices.resource.k8s.io", None, False),
        ("daemon", "delete", "deviceclasses.resource.k8s.io", None, False),
        ("daemon", "list", "resourceslices.resource.k8s.io", None, True),
        ("daemon", "create", "secrets", "default", True),
        ("daemon", "get", "secrets", "default", False),
        ("daemon", "get", "secrets", "RELEASE", False),
        ("daemon", "list", "secrets", None, False),
        ("daemon", "update", "clients.thundercompute.com/finalizers", "default", False),
        ("daemon", "create", "daemonsets.apps", "RELEASE", False),
        ("operator", "create", "resourceslices.resource.k8s.io", None, True),
        ("operator", "deletecollection", "deviceclasses.resource.k8s.io", None, False),
        ("operator", "delete", "deviceclasses.resource.k8s.io", None, True),
        ("operator", "create", "daemonsets.apps", "RELEASE", True),
        ("operator", "create", "daemonsets.apps", "default", False),
        ("operator", "get", "secrets/thunder-api", "RELEASE", True),
        ("operator", "get", "secrets/other", "RELEASE", False),
        ("operator", "get", "secrets/thunder-api", "default", False),
        ("operator", "patch", "clusterkopfpeerings.kopf.dev", None, False),
        ("operator", "get", "leases.coordination.k8s.io/RELEASE", "RELEASE", True),
        ("operator", "update", "leases.coordination.k8s.io/RELEASE", "RELEASE", True),
        ("operator", "create", "leases.coordination.k8s.io", "RELEASE", True),
        ("operator", "update", "leases.coordination.k8s.io/other", "RELEASE", False),
        ("operator", "create", "leases.coordination.k8s.io", "default", False),
        ("operator", "delete", "leases.coordination.k8s.io/RELEASE", "RELEASE", False),
    ],
)
def test_least_privilege_rbac(
    release: Release, who: str, verb: str, resource: str, namespace: str | None, allowed: bool
) -> None:
    sa = f"system:serviceaccount:{release.namespace}:{release.fullname}-{who}"
    # The leader-election Lease is named after the release.
    resource = resource.replace("/RELEASE", f"/{release.fullname}")
    args = ["kubectl", "auth", "can-i", verb, resource, f"--as={sa}"]
    if namespace is not None:
        args += ["-n", release.namespace if namespace == "RELEASE" else namespace]
    done = subprocess.run(args, env=release.env, capture_output=True, text=True, check=False)
    assert (done.stdout.strip() == "yes") is allowed, (who, verb, resource, done.stdout)


def test_a_second_install_beside_the_thundercluster_is_refused(release: Release) -> None:
    done = _helm(
        release.env,
        "install",
        "second",
        CHART,
        "--namespace",
        release.namespace,
        "--dry-run=server",
        check=False,
    )
    assert done.returncode != 0
    assert f'ThunderCluster "{release.cluster_name}" already exists' in done.stderr


def test_an_upgrade_keeps_the_webhook_certificate(release: Release, kube: Kube) -> None:
    secret = kube.core.read_namespaced_secret(f"{release.fullname}-webhook-tls", release.namespace)
    assert secret.data is not None
    done = _helm(
        release.env,
        "upgrade",
        release.name,
        CHART,
        "--namespace",
        release.namespace,
        "--reuse-values",
        "--dry-run=server",
    )
    manifest = done.stdout.split("MANIFEST:", 1)[1].split("\nNOTES:", 1)[0]
    rendered = [d for d in yaml.safe_load_all(manifest) if d]
    tls = next(
        d for d in rendered if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-tls")
    )
    assert tls["data"]["ca.crt"] == secret.data["ca.crt"]
    assert tls["data"]["tls.crt"] == secret.data["tls.crt"]
    assert base64.b64decode(tls["data"]["ca.crt"]).startswith(b"-----BEGIN CERTIFICATE")


def test_helm_test_check_passes_only_once_classes_are_published(
    release: Release, kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in release.env.items():
        if key in ("KUBECONFIG", "PATH"):
            monkeypatch.setenv(key, value)
    # Another test may have published classes in this shared control plane.
    labelled = kube.list_objects(
        "resource.k8s.io/v1",
        "DeviceClass",
        label_selector="app.kubernetes.io/name=thunder-dra-driver",
    )
    if not labelled:
        assert helm_test.run(release.name, release.namespace) != 0
    name = f"thunder-gpu-test-{uuid.uuid4().hex[:6]}"
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "thunder-dra-driver"}},
            "spec": {
                "selectors": [{"cel": {"expression": 'device.driver == "thundercompute.com"'}}]
            },
        }
    )
    try:
        assert helm_test.run(release.name, release.namespace) == 0
    finally:
        kube.delete("resource.k8s.io/v1", "DeviceClass", name)
