"""make install / uninstall / purge as a person runs them, through a pseudo-terminal.

Runs on its own control plane: purge removes the CRDs, which the rest of the suite's
shared control plane needs. The chart is installed with the webhook off, because the
test writes Client objects itself and the local control plane's Service IPs must
never be dialled (see test_packaging_helm_install). No operator runs here, so these
tests stand for "the operator is gone": they put its finalizer on the chart's
ThunderCluster themselves. Uninstalling while the operator runs is tested in
test_packaging_install_with_operator.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from hack.cluster import Cluster
from hack.testbed.kube import Kube, wait_for
from tests.integration.packaging.ptykit import Session, run_on_pty

REPO = Path(__file__).resolve().parents[3]
GROUP = "thundercompute.com/v1alpha1"
PROMPT = "Type the context name to continue"
TOKEN = f"tok-{uuid.uuid4().hex}"
OPERATOR_FINALIZER = "thundercompute.com/operator"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(workdir=tmp_path_factory.mktemp("cp-ops")) as c:
        yield c


@pytest.fixture(scope="module")
def kube(plane: Cluster) -> Kube:
    return Kube(plane.kubeconfig)


def _env(plane: Cluster, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE", "YES", "THUNDER_API_TOKEN")}
    env.update(plane.env())
    env.update({"NAMESPACE": "thunder-system", "HELM_ARGS": "--set webhook.enabled=false"})
    # Nothing here would release the operator's finalizer: do not wait the default 60s.
    env.update({"OPERATOR_WAIT": "2"})
    env.update(extra)
    return env


def _ops(plane: Cluster, command: str, answer: str | None = None, **extra: str) -> Session:
    return run_on_pty(
        [sys.executable, "-m", "ops.deploy", command],
        _env(plane, **extra),
        prompt=PROMPT if answer is not None else None,
        answer=answer or "",
        cwd=str(REPO),
    )


def _context(plane: Cluster) -> str:
    return subprocess.run(
        ["kubectl", "config", "current-context"],
        env=_env(plane),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def _release_exists(plane: Cluster) -> bool:
    done = subprocess.run(
        ["helm", "status", "thunder-device-plugin", "-n", "thunder-system"],
        env=_env(plane),
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def _install(plane: Cluster) -> Session:
    session = _ops(plane, "install", THUNDER_API_TOKEN=TOKEN)
    assert session.returncode == 0, session.output
    return session


def _ensure_installed(plane: Cluster) -> None:
    if not _release_exists(plane):
        _install(plane)


def _client(kube: Kube, namespace: str = "default") -> str:
    name = f"c-{uuid.uuid4().hex[:6]}"
    body: dict[str, Any] = {
        "apiVersion": GROUP,
        "kind": "Client",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "finalizers": ["thundercompute.com/client-cleanup"],
        },
        "spec": {
            "claim": {"namespace": namespace, "name": "claim", "uid": "u-1"},
            "nodeName": "n1",
            "zone": {"name": "z", "id": "z1"},
            "gpuType": "A6000",
            "gpuCount": 1,
        },
    }
    # Only the driver writes Clients (the chart's admission policy): made as the chart's
    # daemon would, its ServiceAccount with the node its Pod runs on.
    api = k8s_config.new_client_from_config(config_file=str(kube.kubeconfig))  # type: ignore[no-untyped-call]
    api.set_default_header(
        "Impersonate-User", "system:serviceaccount:thunder-system:thunder-device-plugin-daemon"
    )
    api.set_default_header("Impersonate-Extra-authentication.kubernetes.io%2fnode-name", "n1")
    k8s.CustomObjectsApi(api).create_namespaced_custom_object(
        "thundercompute.com", "v1alpha1", namespace, "clients", body
    )
    return name


def _hold_as_the_operator_would(kube: Kube, name: str = "thunder") -> None:
    """Put kopf's finalizer on the ThunderCluster, as an operator that ran and stopped."""
    kube.resource(GROUP, "ThunderCluster").patch(
        name=name,
        body={"metadata": {"finalizers": [OPERATOR_FINALIZER]}},
        content_type="application/merge-patch+json",
    )


PEERING_API = "kopf.dev/v1"
PEERING_CRD = "clusterkopfpeerings.kopf.dev"


def _peering_left_by_earlier_releases(kube: Kube) -> None:
    """kopf's peering CRD and objects as a release from before the Lease left them, beside
    another kopf operator's peering object."""
    kube.create(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": PEERING_CRD},
            "spec": {
                "group": "kopf.dev",
                "scope": "Cluster",
                "names": {
                    "plural": "clusterkopfpeerings",
                    "singular": "clusterkopfpeering",
                    "kind": "ClusterKopfPeering",
                },
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    }
                ],
            },
        }
    )
    peerings = k8s.CustomObjectsApi(kube.api_client)
    for name in ("thunder-device-plugin", "another-kopf-operator"):
        body = {"apiVersion": PEERING_API, "kind": "ClusterKopfPeering", "metadata": {"name": name}}
        wait_for(partial(_created, peerings, body), f"clusterkopfpeering/{name} created")


def _peering(kube: Kube, name: str) -> dict[str, Any] | None:
    try:
        found: Any = k8s.CustomObjectsApi(kube.api_client).get_cluster_custom_object(
            "kopf.dev", "v1", "clusterkopfpeerings", name
        )
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return dict(found)


def _created(peerings: k8s.CustomObjectsApi, body: dict[str, Any]) -> bool:
    try:
        peerings.create_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", body)
    except ApiException as err:
        if err.status == 404:  # the new CRD is not served yet
            return False
        raise
    return True


def test_install_creates_the_secret_without_showing_the_token(plane: Cluster, kube: Kube) -> None:
    session = _install(plane)
    assert TOKEN not in session.output
    assert "THUNDER_API_TOKEN from the environment" in session.output
    secret = kube.core.read_namespaced_secret("thunder-api", "thunder-system")
    assert secret.data is not None
    assert "THUNDER_API_TOKEN" in secret.data
    assert _release_exists(plane)
    missing = _ops(plane, "install")
    assert missing.returncode == 3
    assert "THUNDER_API_TOKEN is not set" in missing.output


def test_uninstall_refuses_while_clients_exist(plane: Cluster, kube: Kube) -> None:
    _ensure_installed(plane)
    name = _client(kube)
    try:
        for command in ("uninstall", "purge"):
            session = _ops(plane, command, answer=_context(plane))
            assert session.returncode == 3, session.output
            assert "clients.thundercompute.com still exist (default/" in session.output
            assert PROMPT not in session.output, "refused before asking"
            assert _release_exists(plane)
        forced_wrong = _ops(plane, "uninstall", answer="some-other-cluster", FORCE="1")
        assert forced_wrong.returncode == 3
        assert f"on cluster context: {_context(plane)}" in forced_wrong.output
        assert "not typed back; nothing was changed" in forced_wrong.output
        assert _release_exists(plane)
    finally:
        client = kube.resource(GROUP, "Client")
        client.patch(
            name=name,
            namespace="default",
            body={"metadata": {"finalizers": None}},
            content_type="application/merge-patch+json",
        )
        kube.delete(GROUP, "Client", name, "default")


def test_uninstall_asks_for_the_context_and_removes_the_release(plane: Cluster) -> None:
    _ensure_installed(plane)
    stopped = _ops(plane, "uninstall", answer="nope")
    assert stopped.returncode == 3
    assert _release_exists(plane)
    session = _ops(plane, "uninstall", answer=_context(plane))
    assert session.returncode == 0, session.output
    assert "make purge" in session.output
    assert not _release_exists(plane)


def test_uninstall_clears_the_finalizer_of_an_operator_that_is_gone(
    plane: Cluster, kube: Kube
) -> None:
    _ensure_installed(plane)
    _hold_as_the_operator_would(kube)
    session = _ops(plane, "uninstall", YES="1")
    assert session.returncode == 0, session.output
    assert "deleted thundercluster/thunder" in session.output
    assert (
        f"thundercluster/thunder is still held by the finalizer {OPERATOR_FINALIZER} after 2s: "
        "the operator is not running." in session.output
    )
    assert f"removed finalizer {OPERATOR_FINALIZER} from thundercluster/thunder" in session.output
    assert kube.get(GROUP, "ThunderCluster", "thunder") is None
    assert not _release_exists(plane)


def test_purge_with_force_and_yes_removes_everything(plane: Cluster, kube: Kube) -> None:
    _ensure_installed(plane)
    _hold_as_the_operator_would(kube)
    client = _client(kube)
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {
                "name": "thunder-gpu-a6000",
                "labels": {"app.kubernetes.io/name": "thunder-dra-driver"},
            },
            "spec": {
                "selectors": [{"cel": {"expression": 'device.driver == "thundercompute.com"'}}]
            },
        }
    )
    _peering_left_by_earlier_releases(kube)
    session = _ops(plane, "purge", FORCE="1", YES="1")
    assert session.returncode == 0, session.output
    # The earlier release's peering object goes; another kopf operator's, and so the
    # peering CRD it needs, stay.
    assert "deleted clusterkopfpeering/thunder-device-plugin" in session.output
    assert _peering(kube, "thunder-device-plugin") is None
    assert _peering(kube, "another-kopf-operator") is not None
    assert kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", PEERING_CRD)
    kube.delete("apiextensions.k8s.io/v1", "CustomResourceDefinition", PEERING_CRD, None)
    assert PROMPT not in session.output
    assert "FORCE=1: going ahead although 1 Client(s) exist." in session.output
    assert f"deleted client/{client} -n default" in session.output
    assert "the operator is not running. Removing that finalizer" in session.output
    assert kube.get(GROUP, "ThunderCluster", "thunder") is None
    assert not _release_exists(plane)
    assert kube.get("resource.k8s.io/v1", "DeviceClass", "thunder-gpu-a6000") is None
    for crd in ("thunderclusters.thundercompute.com", "clients.thundercompute.com"):
        assert kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", crd) is None
    assert kube.get("v1", "Namespace", "thunder-system") is None
    assert session.output.rstrip().endswith("purged")
