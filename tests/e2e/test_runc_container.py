"""A stock busybox container, started by runc with our CDI spec applied, sees the Thunder client.

The spec is applied by the reference CDI library (as containerd and CRI-O do),
so this proves the image needs nothing of its own: ``libthunder.so``,
``config.json``, the node's NVIDIA tools and the environment arrive through
read-only bind mounts and env edits, with no hooks.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.support.runc import build_cdi_check, run_with_cdi, runc_unavailable
from thunder_dra.plugin.files import cdi
from thunder_dra.plugin.state.checkpoint import Consumer, PreparedClaim

UID = "0d6f5a52-7a4e-4d0b-9a55-3c1f6c1e9e01"
CONFIG = {"deviceId": "client-9", "clientId": "client-9", "gpuType": "A6000", "gpuCount": 2}

pytestmark = pytest.mark.skipif(runc_unavailable() is not None, reason=str(runc_unavailable()))


def _host_files(root: Path) -> tuple[PreparedClaim, Path, Path, cdi.NodeGpuFiles]:
    claim_dir = root / "claims" / UID
    claim_dir.mkdir(parents=True)
    config_json = claim_dir / "config.json"
    config_json.write_text(json.dumps(CONFIG))
    lib = root / "cache" / "libthunder.so"
    lib.parent.mkdir()
    lib.write_bytes(b"\x7fELF libthunder stand-in")
    driver = root / "driver"
    driver.mkdir()
    smi = driver / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI 610.12 fake host tool'\n")
    smi.chmod(0o755)
    (driver / "libcuda.so.1").write_bytes(b"cuda")
    (driver / "libnvidia-ml.so.1").write_bytes(b"nvml")
    claim = PreparedClaim(
        uid=UID,
        namespace="team-a",
        name="thunder-pod-gpu",
        consumer=Consumer(kind="pod", name="thunder-pod"),
        zone_name="us-east",
        zone_id="zone-1",
        gpu_type="A6000",
        gpu_count=2,
    )
    node_files = cdi.NodeGpuFiles(
        nvidia_smi=smi,
        libcuda=driver / "libcuda.so.1",
        libnvidia_ml=driver / "libnvidia-ml.so.1",
    )
    return claim, config_json, lib, node_files


def test_busybox_sees_library_config_tools_and_environment(tmp_path: Path) -> None:
    spec_dir = tmp_path / "cdi"
    claim, config_json, lib, node_files = _host_files(tmp_path)
    store = cdi.CdiSpecStore(spec_dir, node_gpu_files=lambda: node_files)
    asyncio.run(store.write_claim(claim, config_json=config_json, libthunder=lib))
    script = (
        "cat /etc/thunder/config.json; echo; env; "
        "ls /etc/thunder/libthunder.so /usr/lib/libcuda.so.1 /usr/lib64/libnvidia-ml.so.1; "
        "nvidia-smi; "
        "echo x > /etc/thunder/config.json 2>/dev/null && echo CONFIG-WRITABLE || echo config-ro"
    )
    run = run_with_cdi(
        tmp_path, build_cdi_check(), spec_dir, [cdi.qualified_device_id(UID)], script
    )
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert json.dumps(CONFIG) in out
    for line in (
        "THUNDER_GPU_TYPE=A6000",
        "THUNDER_GPU_COUNT=2",
        f"THUNDER_RESOURCE_CLAIM_UID={UID}",
        "THUNDER_RESOURCE_CLAIM_NAMESPACE=team-a",
        "THUNDER_RESOURCE_CLAIM_NAME=thunder-pod-gpu",
        f"THUNDER_CDI_DEVICE={cdi.qualified_device_id(UID)}",
        "LD_PRELOAD=/etc/thunder/libthunder.so",
    ):
        assert line in out.splitlines(), f"{line} missing from the container environment"
    assert "/usr/lib/libcuda.so.1" in out
    assert "/usr/lib64/libnvidia-ml.so.1" in out
    assert "NVIDIA-SMI 610.12 fake host tool" in out
    assert "config-ro" in out
    assert "CONFIG-WRITABLE" not in out
    hooks = run.oci_spec.get("hooks") or {}
    assert not any(hooks.values()) if isinstance(hooks, dict) else not hooks
