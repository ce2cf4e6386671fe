"""A claim allocated with admin access is refused before anything reaches Thunder.

A Thunder GPU has no monitoring-only side: preparing an admin-access claim would enroll
a second full client for a device another claim holds. The daemon refuses it per claim,
for clusters where the ``no-admin-access`` admission policy is not installed; the rebuild
of a lost checkpoint revokes, rather than re-adopts, a client such a claim got earlier.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.plugin.lifecycle_node import DRIVER, NAMESPACE, POOL, World
from thunder_dra.kube.admissionpolicy import ADMIN_ACCESS_REASON, ADMIN_ACCESS_UNSUPPORTED
from thunder_dra.kube.resources import EVENTS
from thunder_dra.plugin.claims.allocation import parse_claim
from thunder_dra.plugin.errors import ClaimError
from thunder_dra.plugin.metrics import ErrorReason
from thunder_dra.plugin.state.checkpoint import CHECKPOINT_FILE_NAME, PreparedClaim

UID = "uid-1"


def _result(request: str, device: str, **extra: Any) -> dict[str, Any]:
    return {"request": request, "driver": DRIVER, "pool": POOL, "device": device, **extra}


def _claim(*results: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": NAMESPACE, "uid": UID},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


def test_an_admin_access_result_of_this_driver_is_refused_naming_the_request() -> None:
    claim = _claim(
        _result("gpu", "a6000-0"),
        _result("monitor/any", "a6000-1", adminAccess=True),
        _result("watch", "a6000-2", adminAccess=True),
    )
    with pytest.raises(ClaimError) as raised:
        parse_claim(claim, UID, DRIVER)
    assert str(raised.value) == (
        f"{ADMIN_ACCESS_UNSUPPORTED} (request monitor, watch allocated with adminAccess): "
        f"{ADMIN_ACCESS_REASON}"
    )
    assert raised.value.reason is ErrorReason.CLAIM


def test_admin_access_false_and_other_drivers_admin_access_are_prepared() -> None:
    other = {"request": "nic", "driver": "nic.example.com", "pool": "p", "device": "d"}
    claim = _claim(_result("gpu", "a6000-0", adminAccess=False), {**other, "adminAccess": True})
    allocation = parse_claim(claim, UID, DRIVER)
    assert [d.device_name for d in allocation.devices] == ["a6000-0"]


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def test_an_admin_access_claim_fails_alone_and_nothing_is_enrolled_for_it(
    world: World,
) -> None:
    daemon = await world.start()
    admin = world.claim("monitor")
    world.claim_object(admin)["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    error = (
        f"claim {NAMESPACE}/monitor: {ADMIN_ACCESS_UNSUPPORTED} "
        f"(request gpu allocated with adminAccess): {ADMIN_ACCESS_REASON}"
    )
    # Any request to Thunder (API or download) would use up one of the tripwire's answers.
    tripwire = world.thunder.faults.add({"path": "/*", "status": 503, "times": 1000})
    assert await daemon.prepare(admin) == {admin.uid: error}
    assert tripwire.times == 1000
    (event,) = world.of_collection(EVENTS.collection(NAMESPACE))
    assert event["reason"] == "ThunderPrepareFailed"
    assert event["involvedObject"]["uid"] == admin.uid
    assert ADMIN_ACCESS_REASON in event["message"]
    assert world.thunder.faults.remove(tripwire.rule_id)

    fine = world.claim("train")
    results = await daemon.prepare(admin, fine)
    assert results[admin.uid] == error
    prepared = results[fine.uid]
    assert isinstance(prepared, PreparedClaim), prepared
    # One enrollment, one Client record, one claim's files: all the other claim's.
    assert list(world.thunder.state.tokens) == [prepared.enrollment_token_id]
    assert [r["spec"]["claim"]["uid"] for r in world.client_records()] == [fine.uid]
    assert not any(admin.uid in path for path in world.node_files())
    assert admin.uid not in world.checkpoint_claims()
    assert world.open_journal_entries() == []

    assert await daemon.unprepare(fine) == {fine.uid: ""}
    world.assert_clean()


async def test_a_lost_checkpoint_revokes_a_client_an_admin_access_claim_got_earlier(
    world: World,
) -> None:
    """A daemon without this check prepared an admin-access claim; the checkpoint is then
    lost. Its Client record is revoked, not re-adopted (docs/daemon.md)."""
    daemon = await world.start()
    ref = world.claim("monitor")
    prepared = (await daemon.prepare(ref))[ref.uid]
    assert isinstance(prepared, PreparedClaim), prepared
    await daemon.stop()
    world.claim_object(ref)["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    (daemon.config.state_dir / CHECKPOINT_FILE_NAME).unlink()
    await world.start()
    assert world.checkpoint_claims() == {}
    world.assert_clean()
