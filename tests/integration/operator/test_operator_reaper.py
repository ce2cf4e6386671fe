"""The Client reaper revokes enrollments whose ResourceClaim is gone, after the grace period.

The operator of this module runs with the hidden `--orphan-grace-period-override 4s`
(the validated minimum of `orphanGracePeriod` is 30s). Enrollments are real ones in the
fake Thunder: minted and exchanged as the daemon would, so revocation is checked in
Thunder's own state and write log.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from prometheus_client import CollectorRegistry

from hack.fake_thunder import FakeThunderProcess
from hack.testbed.kube import wait_for
from hack.testbed.operator import (
    API_TOKEN,
    RESOURCE_API,
    THUNDER_API,
    OperatorEnv,
)
from thunder_dra.kube.provenance import ANNOTATION, ProvenanceKey
from thunder_dra.thunder import Secret, ThunderClient

GRACE = "4s"
FINALIZER = "thundercompute.com/client-cleanup"


# The operator of this module (the package's `env` fixture) reaps after GRACE.
OPERATOR_ARGS = ("--orphan-grace-period-override", GRACE)


@pytest.fixture
def namespace(env: OperatorEnv) -> Iterator[str]:
    with env.kube.namespace("reaper") as ns:
        yield ns


async def _enroll(fake: FakeThunderProcess, zone_id: str) -> tuple[str, str]:
    async with ThunderClient(
        api_token=API_TOKEN,
        component="daemon",
        base_url=fake.base_url,
        registry=CollectorRegistry(),
    ) as thunder:
        minted = await thunder.mint_client_token(zone_id, "A6000", 1)
        exchanged = await thunder.exchange(minted.enrollment_token, "pod-under-test")
        return minted.enrollment_token_id, exchanged.claims.client_id


def enroll(env: OperatorEnv) -> tuple[str, str]:
    """A real client enrollment in the fake Thunder, as the daemon makes: (token ID, client ID)."""
    zone_id = env.add_zone(env.zone("reap"), [("A6000", 2)])
    return asyncio.run(_enroll(env.fake, zone_id))


def objects(env: OperatorEnv) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(env.kube.api_client)


def record_client(
    env: OperatorEnv,
    namespace: str,
    name: str,
    claim: tuple[str, str],
    token_id: str,
    client_id: str,
    *,
    provenance: str | None = None,
    pending: bool = False,
) -> None:
    """The Client the daemon writes for a prepared claim, with its finalizer.

    Signed as the daemon signs it, unless `provenance` gives the annotation to write
    ("" for none). `pending`: as the daemon leaves it until just after the kubelet's
    answer, the client ID in the spec and no status yet; otherwise as an earlier release
    wrote it, the client ID in the status only."""
    if provenance is None:
        provenance = ProvenanceKey(Secret(API_TOKEN)).sign(
            namespace=namespace,
            name=name,
            claim_uid=claim[1],
            enrollment_token_id=token_id,
            client_id=client_id,
        )
    metadata: dict[str, Any] = {"name": name, "finalizers": [FINALIZER]}
    if provenance:
        metadata["annotations"] = {ANNOTATION: provenance}
    body: dict[str, Any] = {
        "apiVersion": THUNDER_API,
        "kind": "Client",
        "metadata": metadata,
        "spec": {
            "claim": {"namespace": namespace, "name": claim[0], "uid": claim[1]},
            "nodeName": "node-gone",
            "zone": {"name": "somewhere", "id": "zone-x"},
            "gpuType": "A6000",
            "gpuCount": 1,
            "enrollmentTokenId": token_id,
        },
    }
    if pending:
        body["spec"]["clientId"] = client_id
    api = objects(env)
    api.create_namespaced_custom_object(
        "thundercompute.com", "v1alpha1", namespace, "clients", body
    )
    if pending:
        return
    api.patch_namespaced_custom_object_status(
        "thundercompute.com",
        "v1alpha1",
        namespace,
        "clients",
        name,
        {"status": {"phase": "Enrolled", "clientId": client_id}},
    )


def client_object(env: OperatorEnv, namespace: str, name: str) -> dict[str, Any] | None:
    return env.kube.get(THUNDER_API, "Client", name, namespace)


def orphaned_since(env: OperatorEnv, namespace: str, name: str) -> str | None:
    obj = client_object(env, namespace, name) or {}
    value: str | None = (obj.get("status") or {}).get("orphanedSince")
    return value


def resource_claim(env: OperatorEnv, namespace: str, name: str) -> str:
    created = env.kube.create(
        {
            "apiVersion": RESOURCE_API,
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": "thunder-gpu-a6000"}}
                    ]
                }
            },
        }
    )
    uid: str = created["metadata"]["uid"]
    return uid


def assert_revoked(env: OperatorEnv, token_id: str, client_id: str) -> None:
    token = env.fake.admin.token(token_id)
    assert token["state"] == "revoked", token
    state = env.fake.admin.state()
    (record,) = [c for c in state["clients"] if c["clientId"] == client_id]
    assert record["decommissionedAt"], "the Thunder client is decommissioned"
    leaked = [leak for leak in env.fake.admin.leaks() if leak.get("enrollmentTokenId") == token_id]
    assert leaked == []
    by_operator = [
        (w["method"], w["path"])
        for w in env.fake.admin.writes()
        if "(operator)" in str(w.get("userAgent"))
    ]
    assert ("DELETE", f"/api/v1/enrollment-tokens/{token_id}/node") in by_operator
    assert ("POST", f"/api/v1/clients/{client_id}/revoke") in by_operator


def reaper_passes(env: OperatorEnv) -> float:
    return env.operator.metric("thunder_dra_operator_reaper_passes_total")


def test_a_client_whose_claim_has_another_uid_is_revoked_after_the_grace_period(
    env: OperatorEnv, namespace: str
) -> None:
    token_id, client_id = enroll(env)
    resource_claim(env, namespace, "reused")  # same name, a new claim: another UID
    record_client(env, namespace, "orphan", ("reused", str(uuid.uuid4())), token_id, client_id)

    wait_for(lambda: orphaned_since(env, namespace, "orphan"), "orphanedSince to be recorded")
    wait_for(
        lambda: client_object(env, namespace, "orphan") is None,
        "the orphaned Client to be revoked and removed",
    )
    assert_revoked(env, token_id, client_id)
    reasons = {
        e.reason
        for e in env.kube.core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=orphan"
        ).items
    }
    assert {"ClaimGone", "EnrollmentRevoked"} <= reasons
    assert env.operator.metric("thunder_dra_operator_clients_reaped_total", result="revoked") >= 1


def test_a_pending_client_is_revoked_by_the_client_id_in_its_spec(
    env: OperatorEnv, namespace: str
) -> None:
    """A daemon that died between its answer and the record's status write leaves the
    client ID in the spec only: the signature verifies and both revocations are made."""
    token_id, client_id = enroll(env)
    record_client(
        env, namespace, "pending", ("gone", str(uuid.uuid4())), token_id, client_id, pending=True
    )
    wait_for(
        lambda: client_object(env, namespace, "pending") is None,
        "the pending Client to be revoked and removed",
    )
    assert_revoked(env, token_id, client_id)


def test_a_client_deleted_while_its_claim_exists_keeps_its_finalizer(
    env: OperatorEnv, namespace: str
) -> None:
    token_id, client_id = enroll(env)
    claim_uid = resource_claim(env, namespace, "in-use")
    record_client(env, namespace, "held", ("in-use", claim_uid), token_id, client_id)
    objects(env).delete_namespaced_custom_object(
        "thundercompute.com", "v1alpha1", namespace, "clients", "held"
    )
    seen = reaper_passes(env)
    wait_for(lambda: reaper_passes(env) >= seen + 2, "two reaper passes")
    held = client_object(env, namespace, "held")
    assert held is not None, "the finalizer holds the Client while its claim exists"
    assert held["metadata"]["deletionTimestamp"]
    assert held["metadata"]["finalizers"] == [FINALIZER]
    assert not (held.get("status") or {}).get("orphanedSince")
    assert env.fake.admin.token(token_id)["state"] == "spent", "the enrollment is still in use"

    env.kube.delete(RESOURCE_API, "ResourceClaim", "in-use", namespace)
    wait_for(
        lambda: client_object(env, namespace, "held") is None,
        "the Client to go once its claim is gone and the grace period passed",
    )
    assert_revoked(env, token_id, client_id)


def test_an_operator_restart_keeps_the_original_orphaned_since(
    env: OperatorEnv, namespace: str
) -> None:
    token_id, client_id = enroll(env)
    # A long grace period while restarting, so nothing is revoked in between.
    env.operator.restart(["--orphan-grace-period-override", "1h"])
    record_client(
        env, namespace, "survivor", ("never-existed", str(uuid.uuid4())), token_id, client_id
    )
    first = wait_for(lambda: orphaned_since(env, namespace, "survivor"), "orphanedSince recorded")

    env.operator.restart(["--orphan-grace-period-override", "1h"])
    wait_for(lambda: reaper_passes(env) >= 1, "a reaper pass of the new process")
    assert orphaned_since(env, namespace, "survivor") == first, "a restart keeps the grace period"
    assert env.fake.admin.token(token_id)["state"] == "spent"

    # Back to the module's short grace period: it counts from the recorded time.
    env.operator.restart()
    wait_for(
        lambda: client_object(env, namespace, "survivor") is None,
        "the orphan to be revoked",
    )
    assert_revoked(env, token_id, client_id)


def test_the_reaper_log_never_holds_the_token(env: OperatorEnv) -> None:
    assert API_TOKEN not in env.operator.log_text()
    assert API_TOKEN not in env.operator.metrics_text()
