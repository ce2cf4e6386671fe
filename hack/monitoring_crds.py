"""The prometheus-operator CRDs the chart's and config/'s monitoring objects are checked against.

The release is pinned by the tools module ``hack/tools/prometheus-operator`` (its
``go.mod`` names the version, its ``go.sum`` the module zip's checksum). `crd_paths`
returns the ServiceMonitor, PodMonitor and PrometheusRule CRDs of that release, as the
release ships them in ``example/prometheus-operator-crd/``. The first call downloads the
module through the Go module proxy (``go mod download``, which checks the zip against
``go.sum``), copies the three files into
``${XDG_CACHE_HOME:-~/.cache}/thunder-dra/prometheus-operator/<version>-<key>/`` (the key
hashes ``go.mod`` and ``go.sum``) and later calls read them from there.

    python -m hack.monitoring_crds        # print the three paths, downloading if needed
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[1]
TOOLS_MODULE: Final = REPO / "hack" / "tools" / "prometheus-operator"
MODULE: Final = "github.com/prometheus-operator/prometheus-operator"
CRD_DIR: Final = "example/prometheus-operator-crd"
# kind -> the CRD file in CRD_DIR
CRD_FILES: Final = {
    "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
    "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
}


class MonitoringCRDError(RuntimeError):
    """The pinned prometheus-operator module could not be downloaded or lacks a CRD."""


def version() -> str:
    """The prometheus-operator version ``hack/tools/prometheus-operator/go.mod`` requires."""
    for line in (TOOLS_MODULE / "go.mod").read_text().splitlines():
        words = line.split()
        if words[:2] == ["require", MODULE] and len(words) >= 3:
            return words[2]
        if words[:1] == [MODULE] and len(words) >= 2:
            return words[1]
    raise MonitoringCRDError(f"{TOOLS_MODULE / 'go.mod'} requires no {MODULE}")


def _pinned_sum(ver: str) -> str:
    for line in (TOOLS_MODULE / "go.sum").read_text().splitlines():
        words = line.split()
        if len(words) == 3 and words[:2] == [MODULE, ver]:
            return words[2]
    raise MonitoringCRDError(f"{TOOLS_MODULE / 'go.sum'} has no checksum of {MODULE} {ver}")


def cache_dir() -> Path:
    """Where the CRDs of the pinned version are kept (it may not exist yet)."""
    key = hashlib.sha256(
        (TOOLS_MODULE / "go.mod").read_bytes() + (TOOLS_MODULE / "go.sum").read_bytes()
    ).hexdigest()[:16]
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "thunder-dra" / "prometheus-operator" / f"{version()}-{key}"


def _download(ver: str) -> Path:
    """The module's extracted tree in the Go module cache, checked against go.sum."""
    done = subprocess.run(
        ["go", "mod", "download", "-json", f"{MODULE}@{ver}"],
        cwd=TOOLS_MODULE,
        env={**os.environ, "GOWORK": "off"},
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        info = json.loads(done.stdout) if done.stdout.strip() else {}
    except json.JSONDecodeError:
        info = {}
    if done.returncode != 0 or info.get("Error") or not info.get("Dir"):
        raise MonitoringCRDError(
            f"go mod download {MODULE}@{ver} in {TOOLS_MODULE} failed ({done.returncode}): "
            f"{info.get('Error') or done.stderr.strip()}"
        )
    if info.get("Sum") != _pinned_sum(ver):
        raise MonitoringCRDError(
            f"{MODULE}@{ver}: downloaded {info.get('Sum')}, go.sum pins {_pinned_sum(ver)}"
        )
    return Path(info["Dir"])


def crd_paths() -> dict[str, Path]:
    """The ServiceMonitor, PodMonitor and PrometheusRule CRD files, by kind."""
    target = cache_dir()
    paths = {kind: target / name for kind, name in CRD_FILES.items()}
    if all(p.is_file() for p in paths.values()):
        return paths
    source = _download(version()) / CRD_DIR
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    staging.chmod(0o755)
    try:
        for name in CRD_FILES.values():
            if not (source / name).is_file():
                raise MonitoringCRDError(f"{MODULE}@{version()} has no {CRD_DIR}/{name}")
            shutil.copyfile(source / name, staging / name)
        try:
            staging.rename(target)
        except OSError:
            # Another process cached them first; a partial directory is not used.
            if not all(p.is_file() for p in paths.values()):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return paths


def main() -> int:
    try:
        paths = crd_paths()
    except MonitoringCRDError as err:
        print(err, file=sys.stderr)
        return 1
    for kind, path in paths.items():
        print(f"{kind}\t{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
