"""CDI specs: contents, names, version, storage, and never a token."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from thunder_dra import fsutil
from thunder_dra.plugin.files import cdi, clientconfig
from thunder_dra.plugin.state.checkpoint import PreparedClaim

UID = "5d0c8f6e-3a1b-4c2d-9e8f-0a1b2c3d4e5f"
AUTH_TOKEN = "tcat_live_auth_9f8e7d6c5b4a"


def _claim(**overrides: object) -> PreparedClaim:
    values: dict[str, object] = {
        "uid": UID,
        "namespace": "team-a",
        "name": "train-gpu",
        "consumer": {"kind": "pod", "name": "train-pod"},
        "zone_name": "us-east",
        "zone_id": "zone-1",
        "gpu_type": "A6000",
        "gpu_count": 2,
    }
    values.update(overrides)
    return PreparedClaim.model_validate(values)


def _files(tmp_path: Path, uid: str = UID) -> dict[str, Any]:
    """The claim's config.json and the cached library, as build_claim_spec takes them."""
    return {
        "config_json": tmp_path / "claims" / uid / "config.json",
        "libthunder": tmp_path / "cache" / "sha256" / ("a" * 64) / "libthunder.so",
    }


def _spec(tmp_path: Path, claim: PreparedClaim | None = None, **options: Any) -> cdi.CdiSpec:
    claim = claim or _claim()
    return cdi.build_claim_spec(claim, **{**_files(tmp_path, claim.uid), **options})


def _mounts(spec: cdi.CdiSpec) -> dict[str, cdi.CdiMount]:
    return {m.container_path: m for m in spec.devices[0].container_edits.mounts or ()}


def test_spec_for_a_claim(tmp_path: Path) -> None:
    files = _files(tmp_path)
    spec = _spec(tmp_path)
    assert spec.kind == "thundercompute.com/gpu"
    assert spec.cdi_version == "0.4.0"  # mount "type" is a 0.4.0 field
    assert [d.name for d in spec.devices] == [f"claim-{UID}"]
    assert spec.devices[0].container_edits.env == (
        "LD_PRELOAD=/etc/thunder/libthunder.so",
        "THUNDER_GPU_TYPE=A6000",
        "THUNDER_GPU_COUNT=2",
        f"THUNDER_RESOURCE_CLAIM_UID={UID}",
        "THUNDER_RESOURCE_CLAIM_NAMESPACE=team-a",
        "THUNDER_RESOURCE_CLAIM_NAME=train-gpu",
        f"THUNDER_CDI_DEVICE=thundercompute.com/gpu=claim-{UID}",
    )
    mounts = _mounts(spec)
    assert sorted(mounts) == ["/etc/thunder/config.json", "/etc/thunder/libthunder.so"]
    assert mounts["/etc/thunder/config.json"].host_path == str(files["config_json"])
    assert mounts["/etc/thunder/libthunder.so"].host_path == str(files["libthunder"])
    for mount in mounts.values():
        assert mount.options is not None
        assert "ro" in mount.options
        assert "bind" in mount.options
        assert mount.type == "bind"


def test_preload_can_be_left_to_the_pod(tmp_path: Path) -> None:
    spec = _spec(tmp_path, preload=False)
    env = spec.devices[0].container_edits.env or ()
    assert not any(e.startswith("LD_PRELOAD=") for e in env)
    assert "/etc/thunder/libthunder.so" in _mounts(spec)


def test_node_gpu_files_and_ca_bundle_are_mounted_when_given(tmp_path: Path) -> None:
    files = cdi.NodeGpuFiles(
        nvidia_smi=Path("/usr/bin/nvidia-smi"),
        libcuda=Path("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        libnvidia_ml=Path("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
    )
    spec = _spec(tmp_path, node_gpu_files=files, ca_bundle=Path("/etc/ssl/certs/ca.crt"))
    mounts = _mounts(spec)
    assert mounts["/usr/local/bin/nvidia-smi"].host_path == "/usr/bin/nvidia-smi"
    for directory in ("/usr/lib", "/usr/lib64"):
        assert mounts[f"{directory}/libcuda.so.1"].host_path == str(files.libcuda)
        assert mounts[f"{directory}/libnvidia-ml.so.1"].host_path == str(files.libnvidia_ml)
    assert mounts["/etc/ssl/certs/ca-certificates.crt"].host_path == "/etc/ssl/certs/ca.crt"
    env = spec.devices[0].container_edits.env or ()
    assert not any(e.startswith(("PATH=", "LD_LIBRARY_PATH=")) for e in env)


def test_missing_node_files_are_not_mounted(tmp_path: Path) -> None:
    files = cdi.NodeGpuFiles(libcuda=Path("/usr/lib64/libcuda.so.1"))
    mounts = _mounts(_spec(tmp_path, node_gpu_files=files))
    assert "/usr/local/bin/nvidia-smi" not in mounts
    assert "/usr/lib/libnvidia-ml.so.1" not in mounts
    assert "/usr/lib64/libcuda.so.1" in mounts
    assert "/etc/ssl/certs/ca-certificates.crt" not in mounts


def test_minimum_version_follows_the_fields_used(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    untyped = cdi.CdiMount(host_path="/a", container_path="/b", options=("ro", "bind"))
    device = cdi.CdiDevice(
        name="claim-x", container_edits=cdi.CdiContainerEdits(env=("A=1",), mounts=(untyped,))
    )
    assert cdi.minimum_cdi_version(spec) == "0.4.0"
    assert cdi.minimum_cdi_version(spec.model_copy(update={"devices": (device,)})) == "0.3.0"


def test_names() -> None:
    assert cdi.device_name(UID) == f"claim-{UID}"
    assert cdi.qualified_device_id(UID) == f"thundercompute.com/gpu=claim-{UID}"
    assert cdi.spec_file_name(UID) == f"thundercompute.com-gpu_claim-{UID}.json"
    assert cdi.transient_spec_name("vendor.com", "class", "a/b") == "vendor.com-class_a_b"
    assert cdi.claim_uid_from_file_name(cdi.spec_file_name(UID)) == UID
    assert cdi.claim_uid_from_file_name("nvidia.com-gpu_claim-x.json") is None
    assert cdi.claim_uid_from_file_name(f"thundercompute.com-gpu_claim-{UID}.yaml") is None


@pytest.mark.parametrize("bad_uid", ["", "a/b", "x-", "has space", "é"])
def test_uids_cdi_cannot_name_are_rejected(bad_uid: str) -> None:
    with pytest.raises(cdi.CdiError):
        cdi.spec_file_name(bad_uid)


def test_relative_host_paths_and_zero_gpus_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(cdi.CdiError, match="not absolute"):
        _spec(tmp_path, config_json=Path("config.json"))
    with pytest.raises(ValidationError, match="greater than 0"):
        _claim(gpu_count=0)  # so no spec can be built for one


def test_models_reject_unknown_fields_and_credentials() -> None:
    with pytest.raises(ValidationError):
        cdi.CdiSpec.model_validate(
            {"cdiVersion": "0.3.0", "kind": "a.com/b", "devices": [], "hooks": []}
        )
    with pytest.raises(ValidationError):
        cdi.CdiMount.model_validate({"hostPath": "/a", "containerPath": "/b", "uid": 0})
    with pytest.raises(ValidationError, match="credential"):
        cdi.CdiContainerEdits(env=("THUNDER_ENROLLMENT_TOKEN=abc",))
    with pytest.raises(ValidationError, match="KEY=VALUE"):
        cdi.CdiContainerEdits(env=("NOVALUE",))


async def test_written_spec_never_holds_a_token(
    tmp_path: Path, make_exchange: Callable[..., Any]
) -> None:
    # The real flow: config.json (holding the client auth token) in the claim directory,
    # then the spec that mounts it. Neither the token nor the JWT may leak into the spec.
    exchange = make_exchange(AUTH_TOKEN)
    jwt = exchange.jwt.reveal()
    config = clientconfig.client_config_from_exchange(
        exchange, central_api_url="https://api.example"
    )
    claim_directory = tmp_path / "claims" / UID
    config_path = await clientconfig.write_client_config(claim_directory, config)
    files = {**_files(tmp_path), "config_json": config_path}
    path = await cdi.CdiSpecStore(tmp_path / "cdi").write_claim(_claim(), **files)
    text = path.read_text()
    assert AUTH_TOKEN not in text
    assert jwt not in text
    assert "token" not in text.lower()
    assert AUTH_TOKEN in config_path.read_text()  # the mounted file is where it belongs


async def test_store_write_is_atomic_idempotent_and_world_readable(tmp_path: Path) -> None:
    store = cdi.CdiSpecStore(tmp_path / "cdi")
    claim, files = _claim(), _files(tmp_path)
    path = await store.write_claim(claim, **files)
    assert path == tmp_path / "cdi" / f"thundercompute.com-gpu_claim-{UID}.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    first = path.stat()
    assert await store.write_claim(claim, **files) == path
    again = path.stat()
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
    await store.write_claim(_claim(gpu_count=4), **files)
    assert "THUNDER_GPU_COUNT=4" in path.read_text()
    assert os.listdir(tmp_path / "cdi") == [path.name]
    loaded = cdi.CdiSpec.model_validate_json(path.read_bytes())
    assert loaded == _spec(tmp_path, _claim(gpu_count=4))


async def test_the_store_mounts_the_node_files_present_at_each_write(tmp_path: Path) -> None:
    present = [cdi.NodeGpuFiles()]
    store = cdi.CdiSpecStore(
        tmp_path / "cdi", node_gpu_files=lambda: present[0], ca_bundle=Path("/etc/ssl/ca.crt")
    )
    path = await store.write_claim(_claim(), **_files(tmp_path), preload=False)
    spec = cdi.CdiSpec.model_validate_json(path.read_bytes())
    assert spec == _spec(tmp_path, ca_bundle=Path("/etc/ssl/ca.crt"), preload=False)
    assert "/usr/local/bin/nvidia-smi" not in _mounts(spec)
    present[0] = cdi.NodeGpuFiles(nvidia_smi=Path("/usr/bin/nvidia-smi"))  # installed since
    await store.write_claim(_claim(), **_files(tmp_path))
    mounts = _mounts(cdi.CdiSpec.model_validate_json(path.read_bytes()))
    assert mounts["/usr/local/bin/nvidia-smi"].host_path == "/usr/bin/nvidia-smi"


async def test_store_refuses_a_spec_for_another_claim(tmp_path: Path) -> None:
    store = cdi.CdiSpecStore(tmp_path)
    other = _spec(tmp_path, _claim(uid="other-uid"))
    with pytest.raises(cdi.CdiError, match="exactly device"):
        await store.write(UID, other)


async def test_remove_and_list(tmp_path: Path) -> None:
    directory = tmp_path / "cdi"
    store = cdi.CdiSpecStore(directory)
    assert await store.list_claim_uids() == []
    assert await store.remove(UID) is False  # missing is done
    await store.write_claim(_claim(), **_files(tmp_path))
    await store.write_claim(_claim(uid="0-other"), **_files(tmp_path, "0-other"))
    (directory / "nvidia.com-gpu_claim-x.json").write_text("{}")
    (directory / f".thundercompute.com-gpu_claim-{UID}.json.tmp-abc").write_text("partial")
    assert await store.list_claim_uids() == ["0-other", UID]
    assert await store.remove_temp_files() == 1
    assert await store.remove(UID) is True
    assert await store.remove(UID) is False
    assert await store.list_claim_uids() == ["0-other"]
    assert (directory / "nvidia.com-gpu_claim-x.json").exists()


async def test_remove_temp_files_removes_only_this_drivers_leftovers(tmp_path: Path) -> None:
    directory = tmp_path / "cdi"
    store = cdi.CdiSpecStore(directory)
    assert await store.remove_temp_files() == 0  # no directory yet: nothing to do
    spec = await store.write_claim(_claim(), **_files(tmp_path))
    # What a crash between the temporary write and the rename leaves: ours, for a claim
    # with a spec and for one without.
    ours = [fsutil.temp_path_for(spec), fsutil.temp_path_for(store.path_for("0-other"))]
    # The directory is shared: another vendor's specs and its own temporary files, and a
    # hidden file of ours that is no temporary file, are never touched.
    theirs = [
        directory / ".nvidia.com-gpu_claim-x.json.tmp-0123456789ab",
        directory / ".nvidia.com-gpu.json.tmp-abc",
        directory / "nvidia.com-gpu.yaml",
        directory / f".thundercompute.com-gpu_claim-{UID}.json",
    ]
    for path in [*ours, *theirs]:
        path.write_text("partial")
    assert await store.remove_temp_files() == 2
    assert not any(path.exists() for path in ours)
    assert all(path.read_text() == "partial" for path in theirs)
    assert spec.is_file()
    assert await store.list_claim_uids() == [UID]
    assert await store.remove_temp_files() == 0
