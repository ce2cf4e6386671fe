"""The daemon's claim status writes, with its real ServiceAccount token, on the local apiserver.

The chart's ServiceAccounts, daemon RBAC and admission policies are installed as in
test_security_daemon_privileges.py (its ``install``, ``nodes`` and ``daemons`` fixtures):
the daemon's identity is a token bound to a Pod on a simulated node. A claim is allocated
by the test as the scheduler would (a device of this driver and one of another driver),
and then:

- the daemon's own status writer (server-side apply of its entries) succeeds;
- the API server's per-driver check refuses the daemon another driver's entry, and its
  binding check refuses it ``reservedFor``, with the shipped RBAC alone;
- given more RBAC than the chart grants (``arbitrary-node:patch`` for the other driver,
  ``resourceclaims/binding``), the ``daemon-claim-status`` admission policy still refuses
  both, with its own messages;
- ``associated-node:patch`` is not enough for an allocation whose ``nodeSelector`` names a
  zone (what a Thunder device's allocation holds), and is for one that names the caller's
  own node.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from hack.cluster import Cluster
from hack.cluster.nodes import create_node, delete_node
from hack.testbed.kube import Kube, wait_for
from tests.integration.security.test_security_daemon_privileges import (
    DaemonIdentity,
    Install,
    daemon_identity,
    daemons,
    install,
    nodes,
)
from thunder_dra.kube.errors import KubeError
from thunder_dra.kube.naming import LABEL_ZONE
from thunder_dra.kube.transport import build_client
from thunder_dra.plugin.claims.status import ClaimStatusWriter, ClaimTarget, Outcome

__all__ = ["daemons", "install", "nodes"]

DRIVER = "thundercompute.com"
OTHER = "net.example.com"
RESOURCE = ("resource.k8s.io", "v1")
POLICY_DRIVER = (
    f"the daemon may change only the status.devices entries of its own driver ({DRIVER})"
)
POLICY_BINDING = "the daemon may not change a claim's status.allocation or reservedFor"


def _message(err: ApiException) -> tuple[int, str]:
    body = err.body.decode() if isinstance(err.body, bytes) else str(err.body or "")
    try:
        return int(err.status or 0), str(json.loads(body).get("message", body))
    except ValueError:
        return int(err.status or 0), body


def _refused(call: Any, *args: Any) -> tuple[int, str]:
    try:
        call(*args)
    except ApiException as err:
        return _message(err)
    raise AssertionError("the write was allowed")


def _allocated_claim(
    kube: Kube, namespace: str, node_selector: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A claim allocated a device of this driver and one of another, with the other
    driver's entry in status.devices, written as the administrator."""
    name = f"status-{uuid.uuid4().hex[:6]}"
    requests = [
        {"name": "gpu", "exactly": {"deviceClassName": "thunder-gpu-x"}},
        {"name": "nic", "exactly": {"deviceClassName": "nic-x"}},
    ]
    kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": requests}},
        }
    )
    results = [
        {"request": "gpu", "driver": DRIVER, "pool": "sec-zone-a6000", "device": "gpu-0"},
        {"request": "nic", "driver": OTHER, "pool": "sec-node", "device": "eth1"},
    ]
    allocation: dict[str, Any] = {"devices": {"results": results}}
    if node_selector is not None:
        allocation["nodeSelector"] = node_selector
    custom = k8s.CustomObjectsApi(kube.api_client)
    custom.patch_namespaced_custom_object_status(
        *RESOURCE, namespace, "resourceclaims", name, {"status": {"allocation": allocation}}
    )
    other = {
        "driver": OTHER,
        "pool": "sec-node",
        "device": "eth1",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Up",
                "message": "",
                "lastTransitionTime": "2026-12-01T00:00:00Z",
            }
        ],
    }
    custom.patch_namespaced_custom_object_status(
        *RESOURCE, namespace, "resourceclaims", name, {"status": {"devices": [other]}}
    )
    stored: dict[str, Any] = kube.get("resource.k8s.io/v1", "ResourceClaim", name, namespace) or {}
    return stored


def _write_as_daemon(daemon: DaemonIdentity, claim: dict[str, Any]) -> None:
    meta = claim["metadata"]
    outcome = Outcome(
        ready=True, reason="Prepared", message="ok", data={"zone": "sec-zone", "gpuModel": "A6000"}
    )

    async def run() -> None:
        async with build_client(daemon.kubeconfig, user_agent="security-test") as kube:
            writer = ClaimStatusWriter(kube, driver=DRIVER, scrub=str, registry=CollectorRegistry())
            await writer.write(ClaimTarget(meta["namespace"], meta["name"], meta["uid"]), outcome)

    asyncio.run(run())


def _devices(kube: Kube, claim: dict[str, Any]) -> list[dict[str, Any]]:
    meta = claim["metadata"]
    stored = kube.get("resource.k8s.io/v1", "ResourceClaim", meta["name"], meta["namespace"]) or {}
    devices: list[dict[str, Any]] = stored["status"].get("devices") or []
    return devices


def _with_other_entry_changed(claim: dict[str, Any], kube: Kube) -> dict[str, Any]:
    devices = json.loads(json.dumps(_devices(kube, claim)))
    for entry in devices:
        if entry["driver"] == OTHER:
            entry["conditions"][0]["message"] = "changed by the daemon"
    return {"status": {"devices": devices}}


def _reserved_for() -> dict[str, Any]:
    pod = {"resource": "pods", "name": "someone", "uid": str(uuid.uuid4())}
    return {"status": {"reservedFor": [pod]}}


def _patch(daemon: DaemonIdentity, claim: dict[str, Any], body: dict[str, Any]) -> Any:
    meta = claim["metadata"]
    return daemon.custom.patch_namespaced_custom_object_status(
        *RESOURCE, meta["namespace"], "resourceclaims", meta["name"], body
    )


def test_the_daemon_writes_its_own_entries_and_nothing_else(
    kube: Kube, install: Install, daemons: tuple[DaemonIdentity, DaemonIdentity]
) -> None:
    daemon, _ = daemons
    claim = _allocated_claim(kube, install.workloads)
    _write_as_daemon(daemon, claim)
    by_driver = {d["driver"]: d for d in _devices(kube, claim)}
    assert by_driver[DRIVER]["data"] == {"zone": "sec-zone", "gpuModel": "A6000"}
    assert by_driver[OTHER]["conditions"][0]["reason"] == "Up"

    # The shipped RBAC: the API server's own checks refuse.
    status, message = _refused(_patch, daemon, claim, _with_other_entry_changed(claim, kube))
    assert status == 422  # the status strategy's field errors: Forbidden on status.devices
    assert 'resource="resourceclaims/driver"' in message
    status, message = _refused(_patch, daemon, claim, _reserved_for())
    assert status == 422
    assert 'resource="resourceclaims/binding"' in message


@pytest.fixture
def wider_grant(kube: Kube, install: Install) -> Iterator[None]:
    """More than the chart grants the daemon: the other driver's entries (in the workload
    namespace) and resourceclaims/binding."""
    name = f"wider-{uuid.uuid4().hex[:5]}"
    rbac = k8s.RbacAuthorizationV1Api(kube.api_client)
    role: Any = {
        "metadata": {"name": name},
        "rules": [
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceclaims/driver"],
                "resourceNames": [OTHER],
                "verbs": ["arbitrary-node:patch"],
            },
        ],
    }
    # The API server checks resourceclaims/binding cluster-wide (no namespace, no name).
    cluster_role: Any = {
        "metadata": {"name": name},
        "rules": [
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceclaims/binding"],
                "verbs": ["patch"],
            }
        ],
    }
    subjects = [
        {"kind": "ServiceAccount", "name": install.daemon_sa, "namespace": install.namespace}
    ]
    rbac.create_namespaced_role(install.workloads, role)
    rbac.create_cluster_role(cluster_role)
    for kind in ("Role", "ClusterRole"):
        binding: Any = {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
            "subjects": subjects,
        }
        if kind == "Role":
            rbac.create_namespaced_role_binding(install.workloads, binding)
        else:
            rbac.create_cluster_role_binding(binding)
    try:
        yield
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)
        rbac.delete_namespaced_role_binding(name, install.workloads)
        rbac.delete_namespaced_role(name, install.workloads)


def test_the_admission_policy_holds_beyond_the_rbac(
    kube: Kube,
    install: Install,
    daemons: tuple[DaemonIdentity, DaemonIdentity],
    wider_grant: None,
) -> None:
    daemon, _ = daemons
    claim = _allocated_claim(kube, install.workloads)

    def refused_by_policy(body: dict[str, Any]) -> tuple[int, str] | None:
        try:
            _patch(daemon, claim, body)
        except ApiException as err:
            status, message = _message(err)
            return (status, message) if "ValidatingAdmissionPolicy" in message else None
        raise AssertionError("the write was allowed")

    # The Role reaches the authorizer a moment after it is created.
    status, message = wait_for(
        lambda: refused_by_policy(_with_other_entry_changed(claim, kube)),
        "the other driver's entry refused by the policy",
        timeout=30,
    )
    assert status == 403
    assert POLICY_DRIVER in message
    status, message = wait_for(
        lambda: refused_by_policy(_reserved_for()), "reservedFor refused by the policy", timeout=30
    )
    assert status == 403
    assert POLICY_BINDING in message
    assert (
        next(d for d in _devices(kube, claim) if d["driver"] == OTHER)["conditions"][0]["message"]
        == ""
    )


@pytest.fixture
def associated_only(
    kube: Kube, cluster: Cluster, install: Install, tmp_path: Any
) -> Iterator[DaemonIdentity]:
    """The daemon's RBAC with associated-node:patch instead of arbitrary-node:patch: a
    second ServiceAccount in the release namespace, its token bound to a Pod on a node of
    its own."""
    name = f"assoc-{uuid.uuid4().hex[:5]}"
    create_node(kube.core, name, zone="sec-zone")
    rbac = k8s.RbacAuthorizationV1Api(kube.api_client)
    account: Any = {"metadata": {"name": name}}
    kube.core.create_namespaced_service_account(install.namespace, account)
    role: Any = {
        "metadata": {"name": name},
        "rules": [
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceclaims", "resourceclaims/status"],
                "verbs": ["get", "patch"],
            },
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceclaims/driver"],
                "resourceNames": [DRIVER],
                "verbs": ["associated-node:patch"],
            },
        ],
    }
    rbac.create_namespaced_role(install.workloads, role)
    binding: Any = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": install.namespace}],
    }
    rbac.create_namespaced_role_binding(install.workloads, binding)
    as_other_sa = Install(install.namespace, install.workloads, install.other, name, [])
    try:
        yield daemon_identity(kube, cluster, as_other_sa, name, tmp_path)
    finally:
        delete_node(kube.core, name)
        rbac.delete_namespaced_role_binding(name, install.workloads)
        rbac.delete_namespaced_role(name, install.workloads)
        kube.core.delete_namespaced_service_account(name, install.namespace)


def test_associated_node_is_not_enough_for_an_allocation_that_names_a_zone(
    kube: Kube, install: Install, associated_only: DaemonIdentity
) -> None:
    zone = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": LABEL_ZONE, "operator": "In", "values": ["sec-zone"]}]}
        ]
    }
    by_zone = _allocated_claim(kube, install.workloads, zone)
    own_node = {
        "nodeSelectorTerms": [
            {
                "matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [associated_only.node]}
                ]
            }
        ]
    }
    by_node = _allocated_claim(kube, install.workloads, own_node)

    def write(claim: dict[str, Any]) -> tuple[int, str] | None:
        try:
            _write_as_daemon(associated_only, claim)
        except Exception as err:
            return 403, str(err)
        return None

    # The Role reaches the authorizer a moment after it is created: wait for the write
    # the node's allocation allows.
    wait_for(lambda: write(by_node) is None, "associated-node:patch allowed on its own node")
    assert [d for d in _devices(kube, by_node) if d["driver"] == DRIVER]
    refusal = write(by_zone)
    assert refusal is not None
    assert "arbitrary-node:patch" in refusal[1]
    assert not [d for d in _devices(kube, by_zone) if d["driver"] == DRIVER]


POLICY_NODE = (
    "the daemon may write the status of a claim allocated to one node (bindsToNode) only"
    " from that node"
)


def _on_node(node: str) -> dict[str, Any]:
    field = {"key": "metadata.name", "operator": "In", "values": [node]}
    return {"nodeSelectorTerms": [{"matchFields": [field]}]}


def test_a_claim_allocated_to_one_node_is_written_only_by_that_nodes_daemon(
    kube: Kube, install: Install, daemons: tuple[DaemonIdentity, DaemonIdentity]
) -> None:
    # With enrollment before binding the allocation names the node (bindsToNode): the
    # shipped arbitrary-node:patch would let any daemon write, the policy does not.
    first, second = daemons

    def refused() -> tuple[dict[str, Any], KubeError] | None:
        # A fresh claim each try: a policy not yet in force lets the write through.
        claim = _allocated_claim(kube, install.workloads, _on_node(second.node))
        try:
            _write_as_daemon(first, claim)
        except KubeError as err:
            return claim, err
        return None

    claim, err = wait_for(refused, "the other node's daemon refused", timeout=60)
    assert err.status == 403
    assert POLICY_NODE in str(err)
    assert not [d for d in _devices(kube, claim) if d["driver"] == DRIVER]
    _write_as_daemon(second, claim)
    assert [d for d in _devices(kube, claim) if d["driver"] == DRIVER]
