"""Run a busybox container with runc after applying CDI devices with the reference CDI library.

This is what a container runtime does with the CDI device IDs the kubelet gets
from NodePrepareResources: the ``cdi-check`` tool (built from
``tags.cncf.io/container-device-interface``) injects the devices into an OCI
runtime spec, and runc starts the container from it. No images, no CRI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUSYBOX_APPLETS = ("sh", "cat", "env", "ls", "touch", "echo", "test", "grep", "stat")


def runc_unavailable() -> str | None:
    """Why a runc container cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "runc containers need root here (no user namespaces are set up)"
    if shutil.which("runc") is None:
        return "runc is not installed (hack/ensure-runc.sh installs it as root)"
    if _busybox() is None:
        return "a static busybox is not installed (Debian package busybox-static)"
    if not Path("/sys/fs/cgroup").is_dir():
        return "no cgroup filesystem at /sys/fs/cgroup"
    return None


def _busybox() -> Path | None:
    for candidate in ("/bin/busybox", "/usr/bin/busybox"):
        if Path(candidate).is_file():
            return Path(candidate)
    return None


def build_cdi_check() -> Path:
    built = subprocess.run(
        [str(ROOT / "hack" / "build-cdi-check.sh")],
        capture_output=True,
        text=True,
        timeout=1200,
        check=True,
    )
    return Path(built.stdout.strip().splitlines()[-1])


@dataclass
class ContainerRun:
    returncode: int
    stdout: str
    stderr: str
    oci_spec: dict[str, object]


def run_with_cdi(
    workdir: Path, cdi_check: Path, spec_dir: Path, device_ids: list[str], script: str
) -> ContainerRun:
    """Run ``sh -c script`` in a busybox container with the CDI devices applied."""
    busybox = _busybox()
    assert busybox is not None
    bundle = workdir / "bundle"
    bin_dir = bundle / "rootfs" / "bin"
    bin_dir.mkdir(parents=True)
    shutil.copy2(busybox, bin_dir / "busybox")
    for applet in BUSYBOX_APPLETS:
        (bin_dir / applet).symlink_to("busybox")
    for d in ("etc", "usr/lib", "usr/lib64", "usr/local/bin", "tmp", "proc", "dev", "sys"):
        (bundle / "rootfs" / d).mkdir(parents=True, exist_ok=True)
    subprocess.run(["runc", "spec"], cwd=bundle, check=True)
    config_path = bundle / "config.json"
    config = json.loads(config_path.read_text())
    config["process"]["terminal"] = False
    config["process"]["args"] = ["/bin/sh", "-c", script]
    config["process"]["env"] = ["PATH=/usr/local/bin:/bin", "LD_PRELOAD=/image/own.so"]
    config_path.write_text(json.dumps(config))

    injected = subprocess.run(
        [str(cdi_check), "--spec-dir", str(spec_dir), "--oci-spec", str(config_path), *device_ids],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if injected.returncode != 0:
        raise AssertionError(f"cdi-check refused the spec: {injected.stderr}")
    oci_spec: dict[str, object] = json.loads(injected.stdout)
    config_path.write_text(json.dumps(oci_spec))

    state = workdir / "runc-state"
    name = f"thunder-e2e-{uuid.uuid4().hex[:8]}"
    try:
        done = subprocess.run(
            ["runc", "--root", str(state), "run", "--bundle", str(bundle), name],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    finally:
        subprocess.run(
            ["runc", "--root", str(state), "delete", "-f", name],
            capture_output=True,
            check=False,
        )
    return ContainerRun(done.returncode, done.stdout, done.stderr, oci_spec)
