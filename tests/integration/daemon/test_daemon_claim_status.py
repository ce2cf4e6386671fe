"""The real daemon process writes its driver's entries in ResourceClaim.status.devices on
the real API server: Ready with the Thunder client ID (from the fake Thunder's own state)
after a prepare, not Ready with Thunder's error after a refused mint, nothing after an
unprepare, and no write when a repeated prepare changes nothing. The daemon runs with the
test's administrator credentials here; tests/integration/security/ checks its RBAC and the
admission policy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from hack.fake_thunder import FakeThunderProcess
from hack.testbed.daemon import (
    API_TOKEN,
    DRIVER,
    RESOURCE,
    DirectClaim,
    NodeHarness,
    ZonePool,
    allocated_claims,
    dra_prepare,
    dra_unprepare,
    live_clients,
)
from hack.testbed.kube import Kube, wait_for
from thunder_dra.plugin.claims.status import FIELD_MANAGER

MINT = "/api/v1/enrollment-tokens"
WRITES = "thunder_dra_daemon_claim_status_writes_total"


@pytest.fixture(scope="module")
def node(kube: Kube, fake: FakeThunderProcess, pool: ZonePool) -> Iterator[NodeHarness]:
    with NodeHarness(kube, fake, zone=pool.zone) as harness:
        harness.daemon.start().wait_serving()
        yield harness


@pytest.fixture(autouse=True)
def no_faults_left(fake: FakeThunderProcess) -> Iterator[None]:
    yield
    fake.admin.clear_faults()


def _stored(kube: Kube, claim: DirectClaim) -> dict[str, Any]:
    return kube.get(RESOURCE, "ResourceClaim", claim.name, claim.namespace) or {}


def _entries(kube: Kube, claim: DirectClaim) -> list[dict[str, Any]]:
    devices = (_stored(kube, claim).get("status") or {}).get("devices") or []
    return [d for d in devices if d["driver"] == DRIVER]


def _ready(kube: Kube, claim: DirectClaim, status: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        for entry in _entries(kube, claim):
            for condition in entry.get("conditions") or []:
                if condition["type"] == "Ready" and condition["status"] == status:
                    return entry
        return None

    return wait_for(found, f"Ready {status} in {claim.name}'s status.devices", timeout=30)


def _writes(node: NodeHarness, result: str) -> float:
    return node.daemon.metrics().get(f'{WRITES}{{result="{result}"}}', 0.0)


def test_a_prepared_claim_shows_ready_with_its_thunder_client_and_unprepare_clears_it(
    kube: Kube, fake: FakeThunderProcess, pool: ZonePool, namespace: str, node: NodeHarness
) -> None:
    (claim,) = allocated_claims(kube, namespace, pool, 1, prefix="status")
    answers = dra_prepare(node.daemon, [claim])
    assert answers[claim.uid].error == ""
    entry = _ready(kube, claim, "True")
    (client,) = [c for c in live_clients(fake, pool.zone_id) if c["displayName"] == claim.name]
    assert entry["data"] == {
        "zone": pool.zone,
        "gpuModel": pool.gpu_type,
        "thunderClientId": client["clientId"],
    }
    (condition,) = entry["conditions"]
    assert condition["reason"] == "Prepared"
    (result,) = _stored(kube, claim)["status"]["allocation"]["devices"]["results"]
    assert (entry["pool"], entry["device"]) == (result["pool"], result["device"])
    text = json.dumps(_stored(kube, claim))
    assert client["authToken"] not in text
    assert API_TOKEN not in text
    managers = {m["manager"] for m in _stored(kube, claim)["metadata"]["managedFields"]}
    assert FIELD_MANAGER in managers

    # The kubelet's repeated prepare changes nothing: nothing is written.
    version = _stored(kube, claim)["metadata"]["resourceVersion"]
    unchanged = _writes(node, "unchanged")
    assert dra_prepare(node.daemon, [claim])[claim.uid].error == ""
    wait_for(lambda: _writes(node, "unchanged") > unchanged, "the unchanged status counted")
    assert _stored(kube, claim)["metadata"]["resourceVersion"] == version

    assert dra_unprepare(node.daemon, [claim])[claim.uid].error == ""
    wait_for(lambda: _entries(kube, claim) == [], "the daemon's entries removed", timeout=30)
    assert _stored(kube, claim)["status"]["allocation"]["devices"]["results"] == [result]
    assert fake.admin.leaks() == []


def test_a_refused_mint_shows_not_ready_with_thunders_error_then_ready_after_a_retry(
    kube: Kube, fake: FakeThunderProcess, pool: ZonePool, namespace: str, node: NodeHarness
) -> None:
    (claim,) = allocated_claims(kube, namespace, pool, 1, prefix="refused")
    fake.admin.add_fault(MINT, method="POST", status=403)
    answers = dra_prepare(node.daemon, [claim])
    assert "Thunder mint failed" in answers[claim.uid].error
    entry = _ready(kube, claim, "False")
    (condition,) = entry["conditions"]
    assert condition["reason"] == "ThunderMintFailed"
    assert condition["message"].startswith("Thunder mint failed")
    assert condition["message"] in answers[claim.uid].error
    assert "data" not in entry
    assert API_TOKEN not in json.dumps(_stored(kube, claim))

    fake.admin.clear_faults()
    assert dra_prepare(node.daemon, [claim])[claim.uid].error == ""
    entry = _ready(kube, claim, "True")
    assert entry["data"]["thunderClientId"]
    assert dra_unprepare(node.daemon, [claim])[claim.uid].error == ""
    wait_for(lambda: _entries(kube, claim) == [], "the daemon's entries removed", timeout=30)
    assert fake.admin.leaks() == []
