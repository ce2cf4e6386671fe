"""Device health through the real daemon process, watched on its DRA socket as the kubelet
watches it: the registration lists DRAResourceHealth v1 and v1alpha1, and both streams
report a prepared device Healthy, then Unhealthy with a message once its Thunder client
is revoked outside the driver, then Unknown while the fake Thunder refuses to list clients.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest

from hack.fake_thunder import FakeThunderProcess
from hack.testbed.daemon import (
    CLIENT_API,
    DRIVER,
    NodeHarness,
    ZonePool,
    allocated_claims,
    dra_prepare,
    dra_unprepare,
)
from hack.testbed.kube import Kube
from thunder_dra.proto_gen import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)

# Long enough for a few snapshots (one every 10 s) after each change.
WATCH_DEADLINE = 120.0


@pytest.fixture(scope="module")
def node(kube: Kube, fake: FakeThunderProcess, pool: ZonePool) -> Iterator[NodeHarness]:
    with NodeHarness(kube, fake, zone=pool.zone) as harness:
        harness.daemon.start().wait_serving()
        yield harness


class Watch:
    """One NodeWatchResources stream of one API version, read as the kubelet reads it."""

    def __init__(self, channel: grpc.Channel, pb: Any, pb_grpc: Any) -> None:
        self.pb = pb
        stub = pb_grpc.DRAResourceHealthStub(channel)
        self.stream = stub.NodeWatchResources(
            pb.NodeWatchResourcesRequest(), timeout=WATCH_DEADLINE * 3
        )

    def until(self, device: str, health: str | None) -> Any:
        """The first report with ``device`` at ``health`` (a HealthStatus name), or without
        ``device`` when ``health`` is None; every report is the whole list."""
        for response in self.stream:
            entries = {d.device.device_name: d for d in response.devices}
            assert len(entries) == len(response.devices), "a device is listed twice"
            entry = entries.get(device)
            if health is None and entry is None:
                return None
            if entry is not None and health is not None:
                wanted = self.pb.HealthStatus.Value(health)
                if entry.health == wanted:
                    return entry
        raise AssertionError(f"the health stream ended before {device} was {health}")


def _revoke_as_someone_else(fake: FakeThunderProcess, client_id: str) -> None:
    """Revoke a client with Thunder's own API and another API token, not through the driver."""
    token = fake.admin.add_api_token(capabilities=["clients:revoke"])
    answer = httpx.post(
        f"{fake.base_url}/api/v1/clients/{client_id}/revoke",
        headers={"Authorization": f"Bearer {token}", "User-Agent": "thunder-console"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text


def test_health_is_reported_on_v1_and_v1alpha1_as_thunder_sees_the_client(
    kube: Kube, fake: FakeThunderProcess, pool: ZonePool, namespace: str, node: NodeHarness
) -> None:
    daemon = node.daemon
    registration = daemon.registry_dir / f"{DRIVER}-{daemon.instance_id}-reg.sock"
    with grpc.insecure_channel(f"unix:{registration}") as channel:
        info = pluginregistration_v1_pb2_grpc.RegistrationStub(channel).GetInfo(
            pluginregistration_v1_pb2.InfoRequest(), timeout=10
        )
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]
    assert node.kubelet.wait_registered(DRIVER).version == "v1.DRAPlugin"

    (claim,) = allocated_claims(kube, namespace, pool, 1, prefix="health")
    with grpc.insecure_channel(f"unix:{daemon.dra_socket}") as channel:
        watches = [
            Watch(channel, dra_health_v1_pb2, dra_health_v1_pb2_grpc),
            Watch(channel, dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc),
        ]
        answer = dra_prepare(daemon, [claim])[claim.uid]
        assert answer.error == ""
        (device,) = answer.devices
        record = kube.get(CLIENT_API, "Client", f"claim-{claim.uid}", namespace) or {}
        client_id = record["spec"]["clientId"]

        for watch in watches:
            entry = watch.until(device.device_name, "HEALTHY")
            assert entry.device.pool_name == device.pool_name
            assert entry.message == f"Thunder client {client_id} is live in zone {pool.zone}"
            assert entry.health_check_timeout_seconds == 30
            assert entry.last_updated_time > 0

        _revoke_as_someone_else(fake, client_id)
        for watch in watches:
            entry = watch.until(device.device_name, "UNHEALTHY")
            assert entry.message.startswith(f"Thunder client {client_id} was revoked")

        fault = fake.admin.add_fault("/api/v1/clients", method="GET", status=503)
        try:
            for watch in watches:
                entry = watch.until(device.device_name, "UNKNOWN")
                assert entry.message.startswith(f"Thunder cannot be read for zone {pool.zone}: ")
                assert "503" in entry.message
            metrics = daemon.metrics()
            assert metrics['thunder_dra_daemon_device_health{health="unknown"}'] == 1
            assert metrics['thunder_dra_daemon_device_health{health="healthy"}'] == 0
        finally:
            assert fault
            fake.admin.clear_faults()

        for watch in watches:
            watch.until(device.device_name, "UNHEALTHY")

        # Unprepared, the device leaves the list.
        assert dra_unprepare(daemon, [claim])[claim.uid].error == ""
        for watch in watches:
            assert watch.until(device.device_name, None) is None
    assert fake.admin.leaks() == []
