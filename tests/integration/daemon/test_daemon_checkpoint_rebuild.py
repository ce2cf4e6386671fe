"""A corrupt checkpoint set aside at start-up orphans no enrollment: the node's Client
records are reconciled with it through the real daemon process (claims that still exist
are re-adopted with the same answer and no new mint, claims that are gone are revoked),
and every claim the kubelet still thinks prepared unprepares cleanly."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from hack.fake_thunder import FakeThunderProcess
from hack.testbed.daemon import (
    CLIENT_API,
    DirectClaim,
    NodeHarness,
    ZonePool,
    allocated_claims,
    dra_prepare,
    dra_unprepare,
    files_under,
    live_clients,
)
from hack.testbed.kube import Kube, wait_for


def _ok(answers: object, claims: list[DirectClaim]) -> None:
    for claim in claims:
        error = answers[claim.uid].error  # type: ignore[index]
        assert error == "", f"{claim.name}: {error}"


def _client_record(kube: Kube, claim: DirectClaim) -> dict[str, object] | None:
    return kube.get(CLIENT_API, "Client", f"claim-{claim.uid}", claim.namespace)


@pytest.fixture
def plain_node(kube: Kube, fake: FakeThunderProcess, pool: ZonePool) -> Iterator[NodeHarness]:
    with NodeHarness(kube, fake, zone=pool.zone) as harness:
        harness.daemon.start().wait_serving()
        yield harness


def test_a_corrupt_checkpoint_set_aside_orphans_no_enrollment(
    kube: Kube,
    fake: FakeThunderProcess,
    pool: ZonePool,
    namespace: str,
    plain_node: NodeHarness,
) -> None:
    daemon = plain_node.daemon
    kept, gone = allocated_claims(kube, namespace, pool, 2, prefix="ckpt")
    first = dra_prepare(daemon, [kept, gone])
    _ok(first, [kept, gone])
    devices_before = [
        (d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in first[kept.uid].devices
    ]
    daemon.stop()
    path = daemon.state_dir / "checkpoint.json"
    path.write_bytes(path.read_bytes()[:-40])  # torn: fails its checksum
    # While the daemon is down, one claim is deleted: nothing can use its enrollment now.
    kube.delete("resource.k8s.io/v1", "ResourceClaim", gone.name, namespace)
    wait_for(
        lambda: kube.get("resource.k8s.io/v1", "ResourceClaim", gone.name, namespace) is None,
        "the deleted claim gone",
    )
    writes_before = len(fake.admin.writes())

    daemon.start().wait_serving()
    assert list(daemon.state_dir.glob("checkpoint.json.corrupt-*"))
    # Re-adopted from its Client record: the kubelet's repeated prepare gets the same
    # answer and mints nothing.
    again = dra_prepare(daemon, [kept])[kept.uid]
    assert again.error == ""
    assert [(d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in again.devices] == (
        devices_before
    )
    mints = [
        w
        for w in fake.admin.writes()[writes_before:]
        if w["method"] == "POST" and w["path"] == "/api/v1/enrollment-tokens"
    ]
    assert mints == []
    checkpoint = json.loads(path.read_text())
    assert sorted(checkpoint["payload"]["claims"]) == [kept.uid]
    # The claim that is gone was revoked from its record at start-up.
    assert _client_record(kube, gone) is None
    [live] = live_clients(fake, pool.zone_id)
    assert live["displayName"] == kept.name

    # The kubelet still thinks both prepared: both unprepare cleanly.
    _ok(dra_unprepare(daemon, [kept, gone]), [kept, gone])
    audit = fake.admin.audit()
    assert audit["leaks"] == []
    assert audit["orphanClients"] == []
    assert live_clients(fake, pool.zone_id) == []
    # The record goes right after the answer, once the enrollment is revoked.
    wait_for(lambda: _client_record(kube, kept) is None, "the Client record removed", timeout=30)
    assert not list(files_under(daemon.cdi_dir))
    assert not list(files_under(daemon.state_dir / "claims"))
