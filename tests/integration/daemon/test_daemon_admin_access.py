"""A claim allocated with admin access is refused by the real daemon process, before any
Thunder call: no enrollment token is minted, no file is written, no Client recorded.

The claim lives in a namespace labelled ``resource.kubernetes.io/admin-access: "true"``
(the API server refuses ``adminAccess`` anywhere else) and its allocation is written
through the status subresource, as the scheduler would, with ``adminAccess: true`` on the
result. No admission policy is installed here: this is the daemon's own check, for
clusters without the ``no-admin-access`` policy.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from hack.fake_thunder import FakeThunderProcess
from hack.testbed.daemon import (
    CLIENT_API,
    DRIVER,
    RESOURCE,
    DirectClaim,
    NodeHarness,
    ZonePool,
    allocated_claims,
    dra_prepare,
    dra_unprepare,
    files_under,
    mints,
)
from hack.testbed.kube import Kube
from thunder_dra.kube.admissionpolicy import ADMIN_ACCESS_REASON, ADMIN_ACCESS_UNSUPPORTED

ADMIN_NAMESPACE_LABEL = "resource.kubernetes.io/admin-access"


@pytest.fixture(scope="module")
def admin_namespace(kube: Kube) -> Iterator[str]:
    with kube.namespace("admin") as name:
        kube.core.patch_namespace(name, {"metadata": {"labels": {ADMIN_NAMESPACE_LABEL: "true"}}})
        yield name


@pytest.fixture(scope="module")
def node(kube: Kube, fake: FakeThunderProcess, pool: ZonePool) -> Iterator[NodeHarness]:
    with NodeHarness(kube, fake, zone=pool.zone) as harness:
        harness.daemon.start().wait_serving()
        yield harness


def _admin_claim(kube: Kube, holder: DirectClaim, name: str) -> DirectClaim:
    """A claim asking admin access to the device ``holder`` is allocated, given that very
    device (what admin access is for: a device another claim holds)."""
    held = kube.get(RESOURCE, "ResourceClaim", holder.name, holder.namespace) or {}
    (result,) = held["status"]["allocation"]["devices"]["results"]
    device_class = held["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
    request = {"name": "gpu", "exactly": {"deviceClassName": device_class, "adminAccess": True}}
    created = kube.create(
        {
            "apiVersion": RESOURCE,
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": holder.namespace},
            "spec": {"devices": {"requests": [request]}},
        }
    )
    assert created["spec"]["devices"]["requests"][0]["exactly"]["adminAccess"] is True
    allocated = {**result, "request": "gpu", "adminAccess": True}
    status = {"status": {"allocation": {"devices": {"results": [allocated]}}}}
    k8s.CustomObjectsApi(kube.api_client).patch_namespaced_custom_object_status(
        "resource.k8s.io", "v1", holder.namespace, "resourceclaims", name, status
    )
    stored = kube.get(RESOURCE, "ResourceClaim", name, holder.namespace) or {}
    assert stored["status"]["allocation"]["devices"]["results"] == [allocated]
    assert allocated["driver"] == DRIVER
    return DirectClaim(holder.namespace, name, str(created["metadata"]["uid"]))


def test_a_claim_allocated_with_admin_access_gets_a_clear_error_and_nothing_is_minted(
    kube: Kube,
    fake: FakeThunderProcess,
    pool: ZonePool,
    admin_namespace: str,
    node: NodeHarness,
) -> None:
    (plain,) = allocated_claims(kube, admin_namespace, pool, 1, prefix="plain")
    admin = _admin_claim(kube, plain, "monitor")
    error = (
        f"claim {admin_namespace}/monitor: {ADMIN_ACCESS_UNSUPPORTED} "
        f"(request gpu allocated with adminAccess): {ADMIN_ACCESS_REASON}"
    )
    writes_before = len(fake.admin.writes())
    answers = dra_prepare(node.daemon, [admin])
    assert answers[admin.uid].error == error
    assert list(answers[admin.uid].devices) == []
    assert mints(fake, since=writes_before) == []
    assert kube.get(CLIENT_API, "Client", f"claim-{admin.uid}", admin_namespace) is None
    assert not any(admin.uid in str(path) for path in files_under(node.daemon.cdi_dir))
    assert not (node.daemon.state_dir / "claims" / admin.uid).exists()
    metrics = node.daemon.metrics()
    assert metrics['thunder_dra_daemon_errors_total{operation="prepare",reason="claim"}'] >= 1

    # In one call with the claim that holds the device, only the admin-access claim fails.
    writes_before = len(fake.admin.writes())
    answers = dra_prepare(node.daemon, [admin, plain])
    assert answers[admin.uid].error == error
    assert answers[plain.uid].error == ""
    assert len(mints(fake, since=writes_before)) == 1
    assert kube.get(CLIENT_API, "Client", f"claim-{plain.uid}", admin_namespace) is not None
    assert kube.get(CLIENT_API, "Client", f"claim-{admin.uid}", admin_namespace) is None

    unprepared = dra_unprepare(node.daemon, [admin, plain])
    assert unprepared[admin.uid].error == ""
    assert unprepared[plain.uid].error == ""
    assert fake.admin.leaks() == []
