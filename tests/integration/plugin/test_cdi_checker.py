"""The specs the daemon writes, checked by the reference CDI implementation (cdi-check).

cdi-check loads a spec directory the way containerd and CRI-O do (strict parsing, name and
version checks) and injects devices into an OCI runtime spec with the same library call
the runtimes make, so a pass here means a runtime accepts the spec and applies our edits.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.runc import build_cdi_check
from thunder_dra.plugin.files import cdi, clientconfig, libcache
from thunder_dra.plugin.state.checkpoint import Consumer, PreparedClaim

ROOT = Path(__file__).resolve().parents[3]
UID = "8b1f2e3d-4c5b-4a69-8788-99aabbccddee"
AUTH_TOKEN = "tcat_integration_auth_secret"
LIBRARY = b"\x7fELF stand-in for libthunder"


@pytest.fixture(scope="module")
def cdi_check() -> Path:
    if shutil.which("go") is None:
        pytest.skip("Go toolchain not found: cdi-check (hack/build-cdi-check.sh) needs it")
    binary = build_cdi_check()
    assert binary.is_file()
    return binary


@dataclass(frozen=True)
class _Secret:
    value: str

    def reveal(self) -> str:
        return self.value


@dataclass(frozen=True)
class _Identity:
    org_id: str = "org-1"
    client_id: str = "client-7"
    gpu_type: str = "A6000"
    gpu_count: int = 2


@dataclass(frozen=True)
class _Exchange:
    auth_token: _Secret
    jwt: _Secret
    claims: _Identity


def _exchange() -> _Exchange:
    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    identity = _Identity()
    payload = {"orgId": "org-1", "clientId": "client-7", "gpuType": "A6000", "gpuCount": 2}
    jwt = f"{b64(b'{}')}.{b64(json.dumps(payload).encode())}.{b64(b'sig')}"
    return _Exchange(auth_token=_Secret(AUTH_TOKEN), jwt=_Secret(jwt), claims=identity)


def _oci_spec(path: Path) -> Path:
    path.write_text(
        json.dumps(
            {
                "ociVersion": "1.2.0",
                "process": {"args": ["sh"], "cwd": "/", "env": ["PATH=/usr/bin:/bin"]},
                "root": {"path": "rootfs", "readonly": True},
                "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            }
        )
    )
    return path


def _check(binary: Path, spec_dir: Path, oci: Path, *ids: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), "--spec-dir", str(spec_dir), "--oci-spec", str(oci), *ids],
        capture_output=True,
        text=True,
        timeout=60,
    )


@dataclass(frozen=True)
class WrittenClaim:
    """The host files a claim's spec mounts."""

    config_json: Path
    libthunder: Path
    node_gpu_files: cdi.NodeGpuFiles


def _claim() -> PreparedClaim:
    return PreparedClaim(
        uid=UID,
        namespace="team-a",
        name="train-gpu",
        consumer=Consumer(kind="pod", name="train-pod"),
        zone_name="us-east",
        zone_id="zone-1",
        gpu_type="A6000",
        gpu_count=2,
    )


async def _write_claim(tmp_path: Path, spec_dir: Path) -> WrittenClaim:
    config = clientconfig.client_config_from_exchange(
        _exchange(), central_api_url="https://api.example"
    )
    config_path = await clientconfig.write_client_config(
        clientconfig.claim_dir(tmp_path / "claims", UID), config
    )

    async def fetch(url: str, dest_path: Path, expected_sha256: str) -> None:
        await asyncio.to_thread(dest_path.write_bytes, LIBRARY)

    library = await libcache.LibthunderCache(tmp_path / "cache", fetch).ensure(
        hashlib.sha256(LIBRARY).hexdigest(), "https://get.example/libthunder.so"
    )
    node = tmp_path / "host"
    node.mkdir()
    for name in ("nvidia-smi", "libcuda.so.1", "libnvidia-ml.so.1"):
        (node / name).write_bytes(b"stand-in")
    written = WrittenClaim(
        config_json=config_path,
        libthunder=library,
        node_gpu_files=cdi.NodeGpuFiles(
            nvidia_smi=node / "nvidia-smi",
            libcuda=node / "libcuda.so.1",
            libnvidia_ml=node / "libnvidia-ml.so.1",
        ),
    )
    store = cdi.CdiSpecStore(spec_dir, node_gpu_files=lambda: written.node_gpu_files)
    await store.write_claim(
        _claim(), config_json=written.config_json, libthunder=written.libthunder
    )
    return written


async def test_our_spec_loads_and_injects_env_and_read_only_mounts(
    cdi_check: Path, tmp_path: Path
) -> None:
    spec_dir = tmp_path / "cdi"
    written = await _write_claim(tmp_path, spec_dir)
    result = _check(
        cdi_check, spec_dir, _oci_spec(tmp_path / "config.json"), cdi.qualified_device_id(UID)
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    oci: dict[str, Any] = json.loads(result.stdout)

    env = oci["process"]["env"]
    assert "PATH=/usr/bin:/bin" in env
    for expected in (
        "LD_PRELOAD=/etc/thunder/libthunder.so",
        "THUNDER_GPU_TYPE=A6000",
        "THUNDER_GPU_COUNT=2",
        f"THUNDER_RESOURCE_CLAIM_UID={UID}",
        "THUNDER_RESOURCE_CLAIM_NAMESPACE=team-a",
        "THUNDER_RESOURCE_CLAIM_NAME=train-gpu",
        f"THUNDER_CDI_DEVICE=thundercompute.com/gpu=claim-{UID}",
    ):
        assert expected in env

    mounts = {m["destination"]: m for m in oci["mounts"]}
    expected_sources = {
        "/etc/thunder/config.json": str(written.config_json),
        "/etc/thunder/libthunder.so": str(written.libthunder),
        "/usr/local/bin/nvidia-smi": str(written.node_gpu_files.nvidia_smi),
        "/usr/lib/libcuda.so.1": str(written.node_gpu_files.libcuda),
        "/usr/lib64/libcuda.so.1": str(written.node_gpu_files.libcuda),
        "/usr/lib/libnvidia-ml.so.1": str(written.node_gpu_files.libnvidia_ml),
        "/usr/lib64/libnvidia-ml.so.1": str(written.node_gpu_files.libnvidia_ml),
    }
    assert set(mounts) == {"/proc", *expected_sources}
    for destination, source in expected_sources.items():
        assert mounts[destination]["source"] == source
        assert "ro" in mounts[destination]["options"]
        assert "bind" in mounts[destination]["options"]
    assert "hooks" not in oci
    assert AUTH_TOKEN not in result.stdout


async def test_the_checker_rejects_what_a_runtime_would(cdi_check: Path, tmp_path: Path) -> None:
    spec_dir = tmp_path / "cdi"
    await _write_claim(tmp_path, spec_dir)
    spec_path = spec_dir / cdi.spec_file_name(UID)
    oci = _oci_spec(tmp_path / "config.json")

    unknown = _check(cdi_check, spec_dir, oci, "thundercompute.com/gpu=claim-unknown")
    assert unknown.returncode == 1
    assert "unresolvable CDI devices" in unknown.stderr

    # Our computed minimum version is exactly the library's: one lower is refused.
    document = json.loads(spec_path.read_text())
    assert document["cdiVersion"] == "0.4.0"
    document["cdiVersion"] = "0.3.0"
    spec_path.write_text(json.dumps(document))
    too_old = _check(cdi_check, spec_dir, oci, cdi.qualified_device_id(UID))
    assert too_old.returncode == 1
    assert "at least v0.4.0" in too_old.stderr

    # Unknown fields fail loading, which is why our models forbid them.
    document["cdiVersion"] = "0.4.0"
    document["devices"][0]["containerEdits"]["mounts"][0]["propagation"] = "rprivate"
    spec_path.write_text(json.dumps(document))
    strict = _check(cdi_check, spec_dir, oci, cdi.qualified_device_id(UID))
    assert strict.returncode == 1
    assert "unknown field" in strict.stderr


def test_a_spec_without_mount_types_is_valid_at_the_base_version(
    cdi_check: Path, tmp_path: Path
) -> None:
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    mount = cdi.CdiMount(host_path="/etc/hostname", container_path="/x", options=("ro", "bind"))
    device = cdi.CdiDevice(
        name=cdi.device_name(UID), container_edits=cdi.CdiContainerEdits(mounts=(mount,))
    )
    draft = cdi.CdiSpec(cdi_version="1.1.0", kind=cdi.CDI_KIND, devices=(device,))
    spec = draft.model_copy(update={"cdi_version": cdi.minimum_cdi_version(draft)})
    assert spec.cdi_version == "0.3.0"
    (spec_dir / cdi.spec_file_name(UID)).write_bytes(spec.to_json())
    result = _check(
        cdi_check, spec_dir, _oci_spec(tmp_path / "config.json"), cdi.qualified_device_id(UID)
    )
    assert result.returncode == 0, result.stderr


async def test_variables_the_image_already_sets_are_followed_not_replaced(
    cdi_check: Path, tmp_path: Path
) -> None:
    # Records the reference library's behaviour (CDI v1.1.0 through runtime-tools): an
    # edit for a variable the OCI spec already holds is appended after it, not put in its
    # place. Which value a program sees then depends on how it reads the environment, so
    # the claim option that drops our LD_PRELOAD remains the way to combine values.
    spec_dir = tmp_path / "cdi"
    await _write_claim(tmp_path, spec_dir)
    oci_path = _oci_spec(tmp_path / "config.json")
    oci = json.loads(oci_path.read_text())
    oci["process"]["env"].append("LD_PRELOAD=/opt/image/libhook.so")
    oci_path.write_text(json.dumps(oci))
    result = _check(cdi_check, spec_dir, oci_path, cdi.qualified_device_id(UID))
    assert result.returncode == 0, result.stderr
    env = json.loads(result.stdout)["process"]["env"]
    preloads = [e for e in env if e.startswith("LD_PRELOAD=")]
    assert preloads == ["LD_PRELOAD=/opt/image/libhook.so", "LD_PRELOAD=/etc/thunder/libthunder.so"]
