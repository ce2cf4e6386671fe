"""The reaper revokes only enrollments this driver recorded.

Whoever may create a Client could name another tenant's enrollment there and wait for
the reaper to revoke it. The operator of this module runs the reaper with a short grace
period; enrollments are real ones in the fake Thunder, and the fake's write log shows
every call the operator made.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from hack.testbed.kube import wait_for
from hack.testbed.operator import API_TOKEN, OperatorEnv
from tests.integration.operator.test_operator_reaper import (
    GRACE,
    assert_revoked,
    client_object,
    enroll,
    orphaned_since,
    record_client,
)
from thunder_dra.kube.provenance import ProvenanceKey
from thunder_dra.thunder import Secret

# The operator of this module (the package's `env` fixture) reaps after GRACE.
OPERATOR_ARGS = ("--orphan-grace-period-override", GRACE)


@pytest.fixture
def tenants(env: OperatorEnv) -> Iterator[tuple[str, str]]:
    with env.kube.namespace("victim") as victim, env.kube.namespace("attacker") as attacker:
        yield victim, attacker


def _operator_calls_for(env: OperatorEnv, token_id: str, client_id: str) -> list[str]:
    return [
        f"{w['method']} {w['path']}"
        for w in env.fake.admin.writes()
        if "(operator)" in str(w.get("userAgent"))
        and (token_id in str(w["path"]) or client_id in str(w["path"]))
    ]


def _reasons(env: OperatorEnv, namespace: str, name: str) -> set[str]:
    events = env.kube.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    ).items
    return {str(event.reason) for event in events}


@pytest.mark.parametrize("forgery", ["unsigned", "copied", "wrong-key"])
def test_a_forged_client_naming_a_real_enrollment_is_not_revoked(
    env: OperatorEnv, tenants: tuple[str, str], forgery: str
) -> None:
    victim, attacker = tenants
    # The victim's enrollment is live and its genuine signed record sits in its namespace.
    token_id, client_id = enroll(env)
    victim_claim = ("gpu", str(uuid.uuid4()))
    genuine = ProvenanceKey(Secret(API_TOKEN)).sign(
        namespace=victim,
        name="victim-record",
        claim_uid=victim_claim[1],
        enrollment_token_id=token_id,
        client_id=client_id,
    )
    signature = {
        "unsigned": "",
        "copied": genuine,
        "wrong-key": ProvenanceKey(Secret("a-token-the-attacker-made-up")).sign(
            namespace=attacker,
            name="forged",
            claim_uid=victim_claim[1],
            enrollment_token_id=token_id,
            client_id=client_id,
        ),
    }[forgery]
    record_client(env, attacker, "forged", victim_claim, token_id, client_id, provenance=signature)

    wait_for(lambda: orphaned_since(env, attacker, "forged"), "the forged Client seen orphaned")
    wait_for(
        lambda: client_object(env, attacker, "forged") is None,
        "the forged Client to be removed",
    )
    assert env.fake.admin.token(token_id)["state"] == "spent", "the enrollment is still live"
    state = env.fake.admin.state()
    (record,) = [c for c in state["clients"] if c["clientId"] == client_id]
    assert not record["decommissionedAt"], "the victim's Thunder client is not decommissioned"
    assert _operator_calls_for(env, token_id, client_id) == []
    assert "NotRecordedByDriver" in _reasons(env, attacker, "forged")
    assert "EnrollmentRevoked" not in _reasons(env, attacker, "forged")
    assert (
        env.operator.metric("thunder_dra_operator_clients_reaped_total", result="unverified") >= 1
    )


def test_a_genuine_orphan_is_still_revoked(env: OperatorEnv, tenants: tuple[str, str]) -> None:
    victim, _ = tenants
    token_id, client_id = enroll(env)
    record_client(env, victim, "orphan", ("gone", str(uuid.uuid4())), token_id, client_id)
    wait_for(
        lambda: client_object(env, victim, "orphan") is None,
        "the genuine orphan to be revoked and removed",
    )
    assert_revoked(env, token_id, client_id)
    assert "EnrollmentRevoked" in _reasons(env, victim, "orphan")
