"""The registration and DRA gRPC surface, driven over real unix sockets by the kubelet stand-in."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest
from kubernetes import client

from hack.testbed.kubelet import KubeletStandIn
from thunder_dra.plugin.kubelet.service import PluginServer, SocketPaths
from thunder_dra.plugin.state.checkpoint import (
    ClaimRef,
    ClaimState,
    Consumer,
    PreparedClaim,
    PreparedDevice,
)
from thunder_dra.proto_gen import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc

DRIVER = "thundercompute.com"


def _prepared(ref: ClaimRef) -> PreparedClaim:
    device = PreparedDevice(
        pool_name="zone-a/a6000",
        device_name="a6000-0",
        request_names=("gpu",),
        cdi_device_ids=(f"{DRIVER}/gpu=claim-{ref.uid}",),
    )
    return PreparedClaim(
        uid=ref.uid,
        namespace=ref.namespace,
        name=ref.name,
        consumer=Consumer(kind="pod", name="trainer"),
        zone_name="zone a",
        zone_id="z-1",
        gpu_type="A6000",
        gpu_count=1,
        devices=(device,),
        state=ClaimState.PREPARED,
    )


class RecordingHandler:
    def __init__(self) -> None:
        self.prepared: list[list[ClaimRef]] = []
        self.unprepared: list[list[ClaimRef]] = []

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PreparedClaim | str]:
        self.prepared.append(list(claims))
        results: dict[str, PreparedClaim | str] = {}
        for c in claims:
            if c.name == "broken":
                results[c.uid] = f"claim {c.namespace}/{c.name}: no allocation"
            elif c.name != "forgotten":
                results[c.uid] = _prepared(c)
        return results

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        self.unprepared.append(list(claims))
        return {c.uid: ("revoke failed" if c.name == "broken" else "") for c in claims}


@pytest.fixture
async def served() -> AsyncIterator[tuple[PluginServer, RecordingHandler, Path]]:
    root = Path(tempfile.mkdtemp(prefix="dra"))
    paths = SocketPaths.for_instance(DRIVER, "pod1", root / "reg", root / "plugins" / DRIVER)
    handler = RecordingHandler()
    server = PluginServer(DRIVER, handler, paths, socket_check_interval=0.05)
    await server.start()
    try:
        yield server, handler, root
    finally:
        await server.stop(grace=0.1)
        shutil.rmtree(root, ignore_errors=True)


async def test_kubelet_registers_the_plugin_with_v1_first(
    served: tuple[PluginServer, RecordingHandler, Path],
) -> None:
    server, _, root = served
    kubelet = KubeletStandIn("node-1", client.ApiClient(), root / "reg")
    await asyncio.to_thread(kubelet.sync_registry)
    plugin = kubelet.endpoint_for(DRIVER)
    assert plugin is not None
    assert plugin.version == "v1.DRAPlugin"
    assert plugin.endpoint == str(server.paths.dra)
    await asyncio.wait_for(server.registration.changed.wait(), 5)
    assert server.registration.registered
    assert kubelet.errors == []


async def test_prepare_answers_every_claim_and_reports_per_claim_errors(
    served: tuple[PluginServer, RecordingHandler, Path],
) -> None:
    server, handler, _ = served
    async with grpc.aio.insecure_channel(f"unix:{server.paths.dra}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        request = dra_v1_pb2.NodePrepareResourcesRequest(
            claims=[
                dra_v1_pb2.Claim(namespace="ns", uid="u1", name="good"),
                dra_v1_pb2.Claim(namespace="ns", uid="u2", name="broken"),
                dra_v1_pb2.Claim(namespace="ns", uid="u3", name="forgotten"),
            ]
        )
        response = await stub.NodePrepareResources(request, timeout=5)
    assert set(response.claims) == {"u1", "u2", "u3"}
    assert list(response.claims["u1"].devices[0].cdi_device_ids) == [f"{DRIVER}/gpu=claim-u1"]
    assert response.claims["u1"].devices[0].pool_name == "zone-a/a6000"
    assert list(response.claims["u1"].devices[0].request_names) == ["gpu"]
    assert response.claims["u1"].error == ""
    assert response.claims["u2"].error == "claim ns/broken: no allocation"
    assert response.claims["u3"].error == "claim was not prepared"
    assert [c.uid for c in handler.prepared[0]] == ["u1", "u2", "u3"]


async def test_v1beta1_is_served_too_and_unprepare_has_an_entry_per_claim(
    served: tuple[PluginServer, RecordingHandler, Path],
) -> None:
    server, _, _ = served
    async with grpc.aio.insecure_channel(f"unix:{server.paths.dra}") as channel:
        stub = dra_v1beta1_pb2_grpc.DRAPluginStub(channel)
        response = await stub.NodeUnprepareResources(
            dra_v1beta1_pb2.NodeUnprepareResourcesRequest(
                claims=[
                    dra_v1beta1_pb2.Claim(namespace="ns", uid="u1", name="good"),
                    dra_v1beta1_pb2.Claim(namespace="ns", uid="u2", name="broken"),
                ]
            ),
            timeout=5,
        )
    assert response.claims["u1"].error == ""
    assert response.claims["u2"].error == "revoke failed"


async def test_deleted_sockets_are_served_again_and_removed_on_stop(
    served: tuple[PluginServer, RecordingHandler, Path],
) -> None:
    server, _, root = served
    server.paths.dra.unlink()
    server.paths.registration.unlink()
    for _ in range(100):
        if server.paths.dra.exists() and server.paths.registration.exists():
            break
        await asyncio.sleep(0.05)
    assert server.socket_restarts == 2
    kubelet = KubeletStandIn("node-1", client.ApiClient(), root / "reg")
    await asyncio.to_thread(kubelet.sync_registry)
    assert kubelet.endpoint_for(DRIVER) is not None
    await server.stop(grace=0.1)
    assert not server.paths.dra.exists()
    assert not server.paths.registration.exists()


def test_socket_paths_are_unique_per_instance_and_bounded() -> None:
    a = SocketPaths.for_instance(DRIVER, "old", Path("/r"), Path("/p"))
    b = SocketPaths.for_instance(DRIVER, "new", Path("/r"), Path("/p"))
    assert a.registration != b.registration
    assert a.dra != b.dra
    with pytest.raises(ValueError, match="unix sockets allow"):
        SocketPaths.for_instance(DRIVER, "x" * 120, Path("/r"), Path("/p"))
