"""The committed gRPC stubs match proto/, and the protos carry the kubelet's wire names."""

from __future__ import annotations

import subprocess
from pathlib import Path

from thunder_dra.proto_gen import (
    dra_health_v1_pb2,
    dra_health_v1alpha1_pb2,
    dra_v1_pb2,
    dra_v1beta1_pb2,
    pluginregistration_v1_pb2,
)

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "thunder_dra" / "proto_gen"


def _generated_files(directory: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in sorted(directory.iterdir())
        if p.is_file() and p.suffix in (".py", ".pyi")
    }


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    subprocess.run(
        [str(ROOT / "release" / "gen-proto.sh"), str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    fresh = _generated_files(tmp_path)
    committed = _generated_files(COMMITTED)
    assert sorted(fresh) == sorted(committed), "run release/gen-proto.sh (make proto)"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert stale == [], f"stale generated stubs {stale}: run release/gen-proto.sh (make proto)"


def _methods(module: object, service: str) -> list[str]:
    descriptor = module.DESCRIPTOR.services_by_name[service]  # type: ignore[attr-defined]
    return [f"/{descriptor.full_name}/{m.name}" for m in descriptor.methods]


def test_grpc_method_paths_are_the_kubelets() -> None:
    assert _methods(pluginregistration_v1_pb2, "Registration") == [
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
    ]
    for module, version in ((dra_v1_pb2, "v1"), (dra_v1beta1_pb2, "v1beta1")):
        service = f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
        assert _methods(module, "DRAPlugin") == [
            f"/{service}/NodePrepareResources",
            f"/{service}/NodeUnprepareResources",
        ]
    # The kubelet names these services "v1.DRAResourceHealth" and
    # "v1alpha1.DRAResourceHealth" in the registration's supported versions too.
    for module, version in ((dra_health_v1_pb2, "v1"), (dra_health_v1alpha1_pb2, "v1alpha1")):
        assert _methods(module, "DRAResourceHealth") == [
            f"/{version}.DRAResourceHealth/NodeWatchResources"
        ]
        health = module.DESCRIPTOR.services_by_name["DRAResourceHealth"]
        assert health.full_name == f"{version}.DRAResourceHealth"
        assert health.methods[0].server_streaming
        assert not health.methods[0].client_streaming


def _fields(message: object) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_field_numbers_are_the_kubelets() -> None:
    assert _fields(pluginregistration_v1_pb2.PluginInfo) == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert _fields(pluginregistration_v1_pb2.RegistrationStatus) == {
        "plugin_registered": 1,
        "error": 2,
    }
    assert _fields(dra_v1_pb2.Device) == {
        "request_names": 1,
        "pool_name": 2,
        "device_name": 3,
        "cdi_device_ids": 4,
        "share_id": 5,
    }
    assert "share_id" not in _fields(dra_v1beta1_pb2.Device)
    for module in (dra_v1_pb2, dra_v1beta1_pb2):
        assert _fields(module.Claim) == {"namespace": 1, "uid": 2, "name": 3}
        assert _fields(module.NodePrepareResourceResponse) == {"devices": 1, "error": 2}
        assert _fields(module.NodeUnprepareResourceResponse) == {"error": 1}
    for health in (dra_health_v1_pb2, dra_health_v1alpha1_pb2):
        assert _fields(health.DeviceHealth) == {
            "device": 1,
            "health": 2,
            "last_updated_time": 3,
            "health_check_timeout_seconds": 4,
            "message": 5,
        }
        assert _fields(health.DeviceIdentifier) == {"pool_name": 1, "device_name": 2}
        assert _fields(health.NodeWatchResourcesResponse) == {"devices": 1}
        assert _fields(health.NodeWatchResourcesRequest) == {}
        assert [(v.name, v.number) for v in health.HealthStatus.DESCRIPTOR.values] == [
            ("UNKNOWN", 0),
            ("HEALTHY", 1),
            ("UNHEALTHY", 2),
        ]


def test_v1_and_v1alpha1_health_messages_are_the_same_on_the_wire() -> None:
    """The kubelet converts a v1alpha1 stream to v1 field by field; one encoding serves both."""
    device = dra_health_v1_pb2.DeviceHealth(
        device=dra_health_v1_pb2.DeviceIdentifier(pool_name="zone-a/a6000", device_name="gpu-0"),
        health=dra_health_v1_pb2.UNHEALTHY,
        last_updated_time=1_800_000_000,
        health_check_timeout_seconds=30,
        message="client revoked",
    )
    wire = dra_health_v1_pb2.NodeWatchResourcesResponse(devices=[device]).SerializeToString()
    decoded = dra_health_v1alpha1_pb2.NodeWatchResourcesResponse.FromString(wire)
    (other,) = decoded.devices
    assert other.device.device_name == "gpu-0"
    assert other.health == dra_health_v1alpha1_pb2.UNHEALTHY
    assert other.message == "client revoked"
    assert other.health_check_timeout_seconds == 30


def test_v1_share_id_is_optional_and_round_trips() -> None:
    device = dra_v1_pb2.Device(pool_name="zone-a/a6000", device_name="a6000-0")
    assert not device.HasField("share_id")
    response = dra_v1_pb2.NodePrepareResourcesResponse()
    response.claims["uid-1"].devices.append(device)
    decoded = dra_v1_pb2.NodePrepareResourcesResponse.FromString(response.SerializeToString())
    assert decoded.claims["uid-1"].devices[0].device_name == "a6000-0"
