"""Device health for the kubelet: the snapshot of Thunder's view and its gRPC streams.

The Thunder client is the real one, answered in-process by the fake Thunder through a
transport that counts every request, so the tests see what the daemon would read.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client import CollectorRegistry

from hack.fake_thunder import FakeThunder
from thunder_dra.plugin import metrics as daemon_metrics
from thunder_dra.plugin.kubelet.health import (
    HEALTH_TIMEOUT_SECONDS,
    MAX_MESSAGE,
    Health,
    HealthMonitor,
    ZoneView,
    device_health,
)
from thunder_dra.plugin.kubelet.service import (
    HEALTH_VERSIONS,
    SUPPORTED_VERSIONS,
    PluginServer,
    SocketPaths,
)
from thunder_dra.plugin.metrics import DaemonMetrics
from thunder_dra.plugin.state.checkpoint import (
    ClaimState,
    Consumer,
    PreparedClaim,
    PreparedDevice,
)
from thunder_dra.proto_gen import (
    dra_health_v1_pb2,
    dra_health_v1_pb2_grpc,
    dra_health_v1alpha1_pb2,
    dra_health_v1alpha1_pb2_grpc,
    pluginregistration_v1_pb2,
    pluginregistration_v1_pb2_grpc,
)
from thunder_dra.thunder import RetryPolicy, ThunderClient
from thunder_dra.thunder.models import ClientRecord, Host

pytestmark = pytest.mark.unit

DRIVER = "thundercompute.com"
API_TOKEN = "tcapi_health_unit_token"
REVOKED_AT = "2026-12-01T10:00:00Z"


def _seed() -> dict[str, Any]:
    """Zone A: one online host, clients c-a-0..c-a-9 live, c-a-gone revoked; zone B: one
    online host and clients c-b-0..c-b-9; zone C: only an offline host, client c-c-0."""
    hosts = [
        {"hostId": "h-a", "zoneId": "z-a", "gpuType": "A6000", "gpuCount": 8},
        {"hostId": "h-b", "zoneId": "z-b", "gpuType": "A6000", "gpuCount": 8},
        {"hostId": "h-c", "zoneId": "z-c", "gpuType": "A6000", "gpuCount": 8, "status": "offline"},
    ]
    clients = [
        {"clientId": f"c-{zone}-{i}", "zoneId": f"z-{zone}", "gpuType": "A6000", "gpuCount": 1}
        for zone in ("a", "b")
        for i in range(10)
    ]
    clients.append(
        {
            "clientId": "c-a-gone",
            "zoneId": "z-a",
            "gpuType": "A6000",
            "gpuCount": 1,
            "decommissionedAt": REVOKED_AT,
        }
    )
    clients.append({"clientId": "c-c-0", "zoneId": "z-c", "gpuType": "A6000", "gpuCount": 1})
    return {
        "zones": [
            {"zoneId": f"z-{zone}", "displayName": f"zone-{zone}"} for zone in ("a", "b", "c")
        ],
        "hosts": hosts,
        "clients": clients,
    }


def _claim(uid: str, zone: str, client_id: str | None, devices: int = 1) -> PreparedClaim:
    return PreparedClaim(
        uid=uid,
        namespace="ns",
        name=f"claim-{uid}",
        consumer=Consumer(kind="pod", name=f"pod-{uid}"),
        zone_name=f"zone-{zone}",
        zone_id=f"z-{zone}",
        gpu_type="A6000",
        gpu_count=devices,
        client_id=client_id,
        devices=tuple(
            PreparedDevice(pool_name=f"zone-{zone}-a6000", device_name=f"gpu-{uid}-{i}")
            for i in range(devices)
        ),
        state=ClaimState.PREPARED,
    )


class CountingTransport(httpx.AsyncBaseTransport):
    """Passes requests on to the fake and records (method, path, zoneId) of each."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.requests: list[tuple[str, str, str | None]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((request.method, request.url.path, request.url.params.get("zoneId")))
        return await self.inner.handle_async_request(request)

    def reads(self) -> list[tuple[str, str | None]]:
        return sorted((path, zone) for method, path, zone in self.requests if method == "GET")


class World:
    def __init__(self) -> None:
        self.fake = FakeThunder(api_tokens=[API_TOKEN], seed=_seed())
        self.transport = CountingTransport(self.fake.transport())
        self.thunder = ThunderClient(
            api_token=API_TOKEN,
            component="daemon",
            base_url="http://fake-thunder",
            transport=self.transport,
            # One attempt: an error answer is seen at once (retries are the client's own
            # business, tested with it).
            retry=RetryPolicy(max_attempts=1),
            registry=CollectorRegistry(),
        )
        self.claims: list[PreparedClaim] = []
        self.metrics = DaemonMetrics(CollectorRegistry())
        self.monitor = HealthMonitor(
            lambda: self.claims,
            self.thunder,
            interval=3600,
            read_timeout=5,
            gauge=self.metrics.device_health,
            clock=lambda: 1_800_000_000.0,
        )

    def fault(self, path: str, **spec: Any) -> None:
        self.fake.faults.add({"path": path, **spec})

    def gauge(self) -> dict[str, float]:
        return {
            s.labels["health"]: s.value
            for family in self.metrics.registry.collect()
            for s in family.samples
            if s.name == "thunder_dra_daemon_device_health"
        }


@pytest.fixture
async def world() -> AsyncIterator[World]:
    made = World()
    try:
        yield made
    finally:
        made.monitor.close()
        await made.thunder.aclose()


def _by_device(devices: Any) -> dict[str, Any]:
    return {d.device_name: d for d in devices}


async def test_a_live_client_in_a_zone_with_an_online_host_is_healthy(world: World) -> None:
    world.claims = [_claim("u1", "a", "c-a-0", devices=2)]
    snapshot = await world.monitor.refresh()
    assert [(d.device_name, d.health) for d in snapshot.devices] == [
        ("gpu-u1-0", Health.HEALTHY),
        ("gpu-u1-1", Health.HEALTHY),
    ]
    assert snapshot.devices[0].message == "Thunder client c-a-0 is live in zone zone-a"
    assert snapshot.devices[0].pool_name == "zone-a-a6000"
    assert snapshot.taken_at == 1_800_000_000
    assert world.gauge() == {"healthy": 2, "unhealthy": 0, "unknown": 0}


async def test_a_client_revoked_outside_the_driver_is_unhealthy_with_a_message(
    world: World,
) -> None:
    world.claims = [_claim("u1", "a", "c-a-0"), _claim("u2", "a", "c-a-1")]
    await world.monitor.refresh()
    # Someone revokes the client with Thunder's own API, not through the driver.
    await world.thunder.revoke_client("c-a-0")
    snapshot = await world.monitor.refresh()
    devices = _by_device(snapshot.devices)
    assert devices["gpu-u1-0"].health is Health.UNHEALTHY
    revoked = devices["gpu-u1-0"].message
    assert revoked.startswith("Thunder client c-a-0 was revoked (decommissioned at ")
    assert devices["gpu-u2-0"].health is Health.HEALTHY
    assert world.gauge() == {"healthy": 1, "unhealthy": 1, "unknown": 0}


async def test_a_client_listed_as_decommissioned_or_missing_is_unhealthy(world: World) -> None:
    world.claims = [_claim("u1", "a", "c-a-gone"), _claim("u2", "a", "c-a-nowhere")]
    devices = _by_device((await world.monitor.refresh()).devices)
    assert devices["gpu-u1-0"].health is Health.UNHEALTHY
    assert devices["gpu-u1-0"].message == (
        "Thunder client c-a-gone was revoked (decommissioned at 2026-12-01T10:00:00+00:00)"
    )
    assert devices["gpu-u2-0"].health is Health.UNHEALTHY
    assert devices["gpu-u2-0"].message == (
        "Thunder client c-a-nowhere is no longer in zone zone-a's client list"
        " (revoked or removed outside the driver)"
    )


async def test_a_zone_without_an_online_host_is_unhealthy(world: World) -> None:
    world.claims = [_claim("u1", "c", "c-c-0"), _claim("u2", "a", "c-a-0")]
    devices = _by_device((await world.monitor.refresh()).devices)
    assert devices["gpu-u1-0"].health is Health.UNHEALTHY
    assert devices["gpu-u1-0"].message == "zone zone-c has no online Thunder host"
    assert devices["gpu-u2-0"].health is Health.HEALTHY

    # Zone A's only host goes offline; then it comes back.
    world.fake.state.hosts["h-a"].status = "offline"
    devices = _by_device((await world.monitor.refresh()).devices)
    assert devices["gpu-u2-0"].health is Health.UNHEALTHY
    assert devices["gpu-u2-0"].message == "zone zone-a has no online Thunder host"
    world.fake.state.hosts["h-a"].status = "active"
    devices = _by_device((await world.monitor.refresh()).devices)
    assert devices["gpu-u2-0"].health is Health.HEALTHY


async def test_a_revoked_client_in_a_zone_without_hosts_gives_both_reasons(world: World) -> None:
    world.fake.state.hosts["h-a"].status = "offline"
    world.claims = [_claim("u1", "a", "c-a-gone")]
    (device,) = (await world.monitor.refresh()).devices
    assert device.health is Health.UNHEALTHY
    assert "c-a-gone was revoked" in device.message
    assert device.message.endswith("; zone zone-a has no online Thunder host")


async def test_a_vm_claim_without_a_client_is_judged_by_its_zone(world: World) -> None:
    world.claims = [_claim("vm1", "a", None), _claim("vm2", "c", None)]
    devices = _by_device((await world.monitor.refresh()).devices)
    assert devices["gpu-vm1-0"].health is Health.HEALTHY
    assert devices["gpu-vm1-0"].message == "zone zone-a has an online Thunder host"
    assert devices["gpu-vm2-0"].health is Health.UNHEALTHY


@pytest.mark.parametrize("path", ["/api/v1/clients", "/api/v1/hosts"])
async def test_thunder_errors_make_the_zone_unknown_with_the_error(world: World, path: str) -> None:
    world.claims = [_claim("u1", "a", "c-a-0"), _claim("u2", "b", "c-b-0")]
    world.fault(path, status=503)
    snapshot = await world.monitor.refresh()
    for device in snapshot.devices:
        assert device.health is Health.UNKNOWN
        assert device.message.startswith(
            f"Thunder cannot be read for zone {device.pool_name.removesuffix('-a6000')}: "
        )
        assert "503" in device.message
        assert API_TOKEN not in device.message
    assert world.gauge() == {"healthy": 0, "unhealthy": 0, "unknown": 2}
    world.fake.faults.clear()
    snapshot = await world.monitor.refresh()
    assert {d.health for d in snapshot.devices} == {Health.HEALTHY}


async def test_a_malformed_answer_makes_the_zone_unknown(world: World) -> None:
    world.claims = [_claim("u1", "a", "c-a-0")]
    world.fault("/api/v1/clients", status=200, body={"clients": [{"clientId": 7}]})
    (device,) = (await world.monitor.refresh()).devices
    assert device.health is Health.UNKNOWN
    assert device.message.startswith("Thunder cannot be read for zone zone-a: ")


async def test_a_slow_thunder_makes_the_zone_unknown_after_the_read_timeout() -> None:
    made = World()
    made.monitor = HealthMonitor(lambda: made.claims, made.thunder, interval=1, read_timeout=0.1)
    made.claims = [_claim("u1", "a", "c-a-0")]
    made.fault("/api/v1/hosts", latencyMs=5000)
    try:
        (device,) = (await made.monitor.refresh()).devices
    finally:
        await made.thunder.aclose()
    assert device.health is Health.UNKNOWN
    assert device.message == "Thunder cannot be read for zone zone-a: no answer within 0.1 s"


class BrokenReader:
    async def list_clients(self, zone_id: str | None = None) -> list[ClientRecord]:
        raise RuntimeError("a bug, not Thunder")

    async def list_hosts(self, zone_id: str | None = None) -> list[Host]:
        return []


async def test_a_failure_of_the_code_itself_reads_unknown() -> None:
    monitor = HealthMonitor(
        lambda: [_claim("u1", "a", "c-a-0")], BrokenReader(), interval=1, read_timeout=1
    )
    (device,) = (await monitor.refresh()).devices
    assert device.health is Health.UNKNOWN
    assert device.message == "Thunder cannot be read for zone zone-a: internal error (RuntimeError)"


async def test_a_long_error_is_cut_to_the_kubelets_message_limit(world: World) -> None:
    world.claims = [_claim("u1", "a", "c-a-0")]
    world.fault("/api/v1/clients", status=500, body={"message": "x " * 5000})
    (device,) = (await world.monitor.refresh()).devices
    assert device.health is Health.UNKNOWN
    assert len(device.message) <= MAX_MESSAGE


async def test_nothing_is_read_when_nothing_is_prepared(world: World) -> None:
    snapshot = await world.monitor.refresh()
    assert snapshot.devices == ()
    world.claims = [_claim("p1", "a", "c-a-0").model_copy(update={"state": ClaimState.PREPARING})]
    assert (await world.monitor.refresh()).devices == ()
    assert world.transport.requests == []
    assert world.gauge() == {"healthy": 0, "unhealthy": 0, "unknown": 0}


async def test_one_list_of_clients_and_of_hosts_per_zone_per_snapshot(world: World) -> None:
    world.claims = [_claim(f"a{i}", "a", f"c-a-{i}") for i in range(10)]
    world.claims += [_claim(f"b{i}", "b", f"c-b-{i}", devices=2) for i in range(10)]
    for _ in range(3):
        snapshot = await world.monitor.refresh()
        assert len(snapshot.devices) == 30
        assert {d.health for d in snapshot.devices} == {Health.HEALTHY}
    per_snapshot = [
        ("/api/v1/clients", "z-a"),
        ("/api/v1/clients", "z-b"),
        ("/api/v1/hosts", "z-a"),
        ("/api/v1/hosts", "z-b"),
    ]
    assert world.transport.reads() == sorted(per_snapshot * 3)
    # Reads only: health reporting never writes to Thunder.
    assert world.fake.writes == []


def test_a_revocation_sticks_over_a_live_record_with_the_same_id() -> None:
    live = ClientRecord.model_validate({"clientId": "c-1", "zoneId": "z-a"})
    revoked = ClientRecord.model_validate(
        {"clientId": "c-1", "zoneId": "z-a", "decommissionedAt": REVOKED_AT}
    )
    host = Host.model_validate({"hostId": "h", "zoneId": "z-a", "gpuType": "A6000", "gpuCount": 1})
    for clients in ([live, revoked], [revoked, live]):
        view = ZoneView.of(clients, [host])
        (device,) = device_health([_claim("u", "a", "c-1")], {"z-a": view})
        assert device.health is Health.UNHEALTHY


def test_a_zone_with_no_view_reads_unknown() -> None:
    (device,) = device_health([_claim("u", "a", "c-1")], {})
    assert device.health is Health.UNKNOWN


def test_the_gauge_labels_are_the_health_states() -> None:
    assert tuple(h.value for h in Health) == daemon_metrics.HEALTH_STATES


def test_the_read_timeout_fits_in_the_interval() -> None:
    reader = World().thunder
    with pytest.raises(ValueError, match="read timeout"):
        HealthMonitor(list, reader, interval=1, read_timeout=2)


# The gRPC surface: registration and the kubelet's watch, over real unix sockets.


class NoClaims:
    async def prepare(self, claims: Any) -> dict[str, PreparedClaim | str]:
        return {}

    async def unprepare(self, claims: Any) -> dict[str, str]:
        return {}


@pytest.fixture
def socket_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="drah"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _serve(world: World, root: Path, *, health: bool = True) -> PluginServer:
    paths = SocketPaths.for_instance(DRIVER, "pod1", root / "reg", root / "plugins" / DRIVER)
    server = PluginServer(
        DRIVER, NoClaims(), paths, device_health=world.monitor if health else None
    )
    await server.start()
    return server


async def _info(server: PluginServer) -> Any:
    async with grpc.aio.insecure_channel(f"unix:{server.paths.registration}") as channel:
        stub = pluginregistration_v1_pb2_grpc.RegistrationStub(channel)
        return await stub.GetInfo(pluginregistration_v1_pb2.InfoRequest(), timeout=5)


async def test_the_registration_lists_both_health_services_when_health_is_served(
    world: World, socket_root: Path
) -> None:
    server = await _serve(world, socket_root)
    try:
        info = await _info(server)
    finally:
        await server.stop(grace=0.1)
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]
    assert HEALTH_VERSIONS == ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")

    plain = await _serve(world, socket_root / "plain", health=False)
    try:
        assert list((await _info(plain)).supported_versions) == list(SUPPORTED_VERSIONS)
    finally:
        await plain.stop(grace=0.1)


async def _next(stream: Any) -> Any:
    return await asyncio.wait_for(stream.read(), 10)


async def test_every_watcher_of_either_version_gets_each_snapshot_whole(
    world: World, socket_root: Path
) -> None:
    world.claims = [_claim("u1", "a", "c-a-0", devices=2), _claim("u2", "c", "c-c-0")]
    server = await _serve(world, socket_root)
    channel = grpc.aio.insecure_channel(f"unix:{server.paths.dra}")
    try:
        request_v1 = dra_health_v1_pb2.NodeWatchResourcesRequest()
        request_alpha = dra_health_v1alpha1_pb2.NodeWatchResourcesRequest()
        streams = [
            dra_health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(request_v1)
            for _ in range(3)
        ] + [
            dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                request_alpha
            )
            for _ in range(3)
        ]
        await world.monitor.refresh()
        first = [await _next(stream) for stream in streams]
        for response in first:
            devices = {
                d.device.device_name: (d.device.pool_name, d.health, d.message)
                for d in response.devices
            }
            assert devices == {
                "gpu-u1-0": ("zone-a-a6000", 1, "Thunder client c-a-0 is live in zone zone-a"),
                "gpu-u1-1": ("zone-a-a6000", 1, "Thunder client c-a-0 is live in zone zone-a"),
                "gpu-u2-0": ("zone-c-a6000", 2, "zone zone-c has no online Thunder host"),
            }
            assert {d.last_updated_time for d in response.devices} == {1_800_000_000}
            assert {d.health_check_timeout_seconds for d in response.devices} == {
                HEALTH_TIMEOUT_SECONDS
            }

        # A revocation is streamed to every watcher with the next snapshot.
        await world.thunder.revoke_client("c-a-0")
        await world.monitor.refresh()
        for stream in streams:
            entries = {d.device.device_name: d for d in (await _next(stream)).devices}
            assert entries["gpu-u1-0"].health == dra_health_v1_pb2.UNHEALTHY
            assert "c-a-0 was revoked" in entries["gpu-u1-0"].message
        # Two snapshots, six watchers: two reads of each list per zone, no more.
        assert world.transport.reads() == sorted(
            [
                ("/api/v1/clients", "z-a"),
                ("/api/v1/clients", "z-c"),
                ("/api/v1/hosts", "z-a"),
                ("/api/v1/hosts", "z-c"),
            ]
            * 2
        )

        # A watcher that connects later gets the newest snapshot at once.
        late = dra_health_v1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(request_v1)
        assert len((await _next(late)).devices) == 3

        # Stopping the server finishes every watch cleanly (the kubelet reads EOF).
        await server.stop(grace=5)
        for stream in [*streams, late]:
            assert await _next(stream) is grpc.aio.EOF  # type: ignore[attr-defined]
            assert await stream.code() == grpc.StatusCode.OK
    finally:
        await channel.close(grace=None)
        await server.stop(grace=0.1)


async def test_the_snapshot_loop_publishes_to_a_waiting_watcher(world: World) -> None:
    fast = HealthMonitor(lambda: world.claims, world.thunder, interval=0.05, read_timeout=0.05)
    world.claims = [_claim("u1", "a", "c-a-0")]
    task = asyncio.create_task(fast.run())
    seen = []
    try:
        async for snapshot in fast.watch():
            seen.append(snapshot.serial)
            if len(seen) == 3:
                break
    finally:
        fast.close()
        await asyncio.wait_for(task, 5)
    assert seen == sorted(seen)
    assert len(set(seen)) == 3
