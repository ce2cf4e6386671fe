"""Fake ``nvidia-smi`` driven by ``$THUNDER_FAKE_HOST/nvidia-smi.json``.

Modes: ``ok`` (driver and GPUs as configured), ``missing`` (exit 127 as if not installed),
``error`` (exit 9, the driver cannot be reached). Supports ``--query-gpu=<fields>
--format=csv[,noheader][,nounits]``, ``-L`` and the plain summary.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from hack.fake_host.state import DEFAULT_DRIVER_VERSION, FakeHost

_DRIVER_ERROR = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


def _gpus(config: dict[str, Any]) -> list[dict[str, Any]]:
    gpus = []
    for index, gpu in enumerate(config.get("gpus") or []):
        gpus.append(
            {
                "index": str(index),
                "name": gpu.get("name", "NVIDIA Fake GPU"),
                "uuid": gpu.get("uuid", f"GPU-00000000-0000-0000-0000-{index:012d}"),
                "memory": int(gpu.get("memoryTotalMiB", 81559)),
                "bus": gpu.get("pciBusId", f"00000000:{index + 1:02X}:00.0"),
            }
        )
    return gpus


def _field(name: str, gpu: dict[str, Any], config: dict[str, Any], units: bool) -> str | None:
    values = {
        "driver_version": config.get("driverVersion", DEFAULT_DRIVER_VERSION),
        "name": gpu["name"],
        "gpu_name": gpu["name"],
        "uuid": gpu["uuid"],
        "gpu_uuid": gpu["uuid"],
        "index": gpu["index"],
        "count": str(len(config.get("gpus") or [])),
        "pci.bus_id": gpu["bus"],
        "memory.total": f"{gpu['memory']} MiB" if units else str(gpu["memory"]),
    }
    return values.get(name)


def _query(argv: list[str], config: dict[str, Any]) -> int:
    fields: list[str] = []
    format_options: list[str] = []
    for arg in argv:
        if arg.startswith("--query-gpu="):
            fields = [f.strip() for f in arg.split("=", 1)[1].split(",") if f.strip()]
        elif arg.startswith("--format="):
            format_options = [o.strip() for o in arg.split("=", 1)[1].split(",")]
    if "csv" not in format_options:
        print("ERROR: --query-gpu needs --format=csv", file=sys.stderr)
        return 2
    gpus = _gpus(config)
    if not gpus:
        print("No devices were found")
        return 6
    units = "nounits" not in format_options
    if "noheader" not in format_options:
        print(", ".join(f"{f} [MiB]" if f == "memory.total" and units else f for f in fields))
    for gpu in gpus:
        row = []
        for name in fields:
            value = _field(name, gpu, config, units)
            if value is None:
                print(f'Field "{name}" is not a valid field to query.', file=sys.stderr)
                return 2
            row.append(value)
        print(", ".join(row))
    return 0


def _summary(config: dict[str, Any]) -> int:
    driver = config.get("driverVersion", DEFAULT_DRIVER_VERSION)
    cuda = config.get("cudaVersion", "13.0")
    rule = "+" + "-" * 78 + "+"
    rows = [f"NVIDIA-SMI {driver}    Driver Version: {driver}    CUDA Version: {cuda}"]
    rows += [
        f"{g['index']:>3}  {g['name']:<40} {g['memory']:>6}MiB  {g['bus']}" for g in _gpus(config)
    ]
    print(rule)
    for row in rows:
        print(f"| {row:<76} |")
    print(rule)
    return 0


def main(argv: list[str]) -> int:
    host = FakeHost.from_env()
    host.log_call("nvidia-smi", argv, dict(os.environ))
    config = host.nvidia()
    mode = config.get("mode", "ok")
    if mode == "missing":
        print("sh: 1: nvidia-smi: not found", file=sys.stderr)
        return 127
    if mode == "error":
        print(config.get("errorMessage") or _DRIVER_ERROR)
        return 9
    if any(arg.startswith("--query-gpu=") for arg in argv):
        return _query(argv, config)
    if "-L" in argv or "--list-gpus" in argv:
        for gpu in _gpus(config):
            print(f"GPU {gpu['index']}: {gpu['name']} (UUID: {gpu['uuid']})")
        return 0
    return _summary(config)
