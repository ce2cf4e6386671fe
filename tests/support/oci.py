"""Read and run the OCI image archives ``make image`` builds (``hack.image``), with runc.

An archive is unpacked with ``umoci`` into a runtime bundle whose ``config.json``
comes from the image's own configuration (user, entrypoint, environment), so running
it with runc starts the image as a container runtime would.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _blob(layout: Path, digest: str) -> Any:
    algo, hexd = digest.split(":", 1)
    return json.loads((layout / "blobs" / algo / hexd).read_text())


@dataclass
class OciImage:
    layout: Path
    index: dict[str, Any]
    manifest: dict[str, Any]
    config: dict[str, Any]


def open_archive(archive: Path, workdir: Path) -> OciImage:
    layout = workdir / "layout"
    layout.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(layout, filter="data")
    index = json.loads((layout / "index.json").read_text())
    manifest = _blob(layout, index["manifests"][0]["digest"])
    config = _blob(layout, manifest["config"]["digest"])
    return OciImage(layout, index, manifest, config)


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    process: dict[str, Any]


def run_image(
    image: OciImage,
    workdir: Path,
    extra_args: list[str],
    timeout: float = 120,
    replace_args: list[str] | None = None,
) -> Run:
    """Run the image's entrypoint plus ``extra_args`` (or ``replace_args``) with runc."""
    bundle = workdir / "bundle"
    # umoci wants the tag as the ref name; point a plain tag at the same manifest.
    index = json.loads((image.layout / "index.json").read_text())
    names = [
        m.get("annotations", {}).get("org.opencontainers.image.ref.name")
        for m in index["manifests"]
    ]
    if "run" not in names:
        plain = dict(
            index["manifests"][0], annotations={"org.opencontainers.image.ref.name": "run"}
        )
        index["manifests"].append(plain)
        (image.layout / "index.json").write_text(json.dumps(index))
    subprocess.run(
        ["umoci", "unpack", "--image", f"{image.layout}:run", str(bundle)],
        check=True,
        capture_output=True,
    )
    config_path = bundle / "config.json"
    config = json.loads(config_path.read_text())
    config["process"]["terminal"] = False
    if replace_args is not None:
        config["process"]["args"] = replace_args
    else:
        config["process"]["args"] = [*config["process"]["args"], *extra_args]
    config_path.write_text(json.dumps(config))
    state = workdir / "runc-state"
    name = f"thunder-image-{uuid.uuid4().hex[:8]}"
    try:
        done = subprocess.run(
            ["runc", "--root", str(state), "run", "--bundle", str(bundle), name],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    finally:
        subprocess.run(
            ["runc", "--root", str(state), "delete", "-f", name], capture_output=True, check=False
        )
        shutil.rmtree(bundle, ignore_errors=True)
    return Run(done.returncode, done.stdout, done.stderr, config["process"])
