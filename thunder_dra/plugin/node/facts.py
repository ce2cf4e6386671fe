"""Start-up facts about this node: zone, role, advertised IP, and (serving nodes) the GPU driver.

A serving node (label ``thundercompute.com/node=true``) must carry its zone label, have an
address Thunder clients can reach, and run an NVIDIA driver of at least the configured
major version; otherwise the daemon stops with a :class:`NodeSetupError` that says what is
missing and how to fix it. A client-only node needs none of that: its claims draw GPUs
from the zone pool over the network.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from thunder_dra.kube import bodies, naming
from thunder_dra.plugin.node.hostrunner import HostCommandError, HostRunner

NVIDIA_SMI_QUERY = ("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
_VERSION = re.compile(r"^\s*(\d+)(?:\.\d+)*\s*$")
_NOT_FOUND_EXIT = 127

log = logging.getLogger(__name__)


class NodeSetupError(Exception):
    """The node cannot run the daemon as configured; the message says what to fix."""


@dataclass(frozen=True)
class NodeInfo:
    name: str
    zone: str | None
    serving: bool
    advertised_ip: str | None


def _valid_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def node_info(
    node: Mapping[str, Any], advertised_ip_label: str, *, consumer_only: bool = False
) -> NodeInfo:
    """Read role, zone and advertised IP from a Node object (as decoded JSON).

    With `consumer_only` (``--node-role consumer``) the node is never serving: the
    consumer DaemonSet's pod cannot enter the host, and a node labelled serving after the
    pod started gets the serving DaemonSet's pod in its place."""
    metadata = bodies.metadata(node)
    name = str(metadata.get("name", ""))
    labels: Mapping[str, str] = metadata.get("labels") or {}
    serving = labels.get(naming.NODE_LABEL_SERVING) == "true"
    if serving and consumer_only:
        log.warning(
            "the node is labelled serving but this daemon runs with --node-role consumer: it "
            "serves claims only and leaves enrollment to the serving DaemonSet's pod",
            extra={"node": name, "label": naming.NODE_LABEL_SERVING},
        )
        serving = False
    zone = labels.get(naming.NODE_LABEL_ZONE) or None
    advertised = labels.get(advertised_ip_label, "").strip()
    if advertised and not _valid_ip(advertised):
        raise NodeSetupError(
            f"node {name}: label {advertised_ip_label}={advertised!r} is not an IP address"
        )
    if not advertised:
        addresses = bodies.status(node).get("addresses") or []
        by_type: dict[str, str] = {}
        for entry in addresses:
            kind, address = entry.get("type"), entry.get("address", "")
            if kind and kind not in by_type and _valid_ip(address):
                by_type[kind] = address
        advertised = by_type.get("InternalIP") or by_type.get("ExternalIP") or ""
    info = NodeInfo(name=name, zone=zone, serving=serving, advertised_ip=advertised or None)
    if serving:
        if info.zone is None:
            raise NodeSetupError(
                f"serving node {name} has no {naming.NODE_LABEL_ZONE} label: label it with "
                f"`kubectl label node {name} {naming.NODE_LABEL_ZONE}=<zone>`"
            )
        if info.advertised_ip is None:
            raise NodeSetupError(
                f"serving node {name} has no node IP: set the {advertised_ip_label} label or "
                "give the node an InternalIP or ExternalIP address"
            )
    return info


def parse_driver_major(output: str) -> int:
    """The lowest driver major version in ``nvidia-smi --query-gpu=driver_version`` output."""
    majors = []
    for line in output.splitlines():
        if not line.strip():
            continue
        found = _VERSION.match(line)
        if found is None:
            raise NodeSetupError(f"cannot read a driver version from nvidia-smi: {line.strip()!r}")
        majors.append(int(found.group(1)))
    if not majors:
        raise NodeSetupError("nvidia-smi lists no GPUs on this serving node")
    return min(majors)


def _first_line(*texts: str) -> str:
    for text in texts:
        for line in text.splitlines():
            if line.strip():
                return line.strip()
    return "no output"


async def check_gpu_driver(runner: HostRunner, node: str, min_major: int) -> str:
    """Run ``nvidia-smi`` on the host; returns the driver version, or raises NodeSetupError."""
    try:
        result = await runner.run(list(NVIDIA_SMI_QUERY), timeout=30.0)
    except FileNotFoundError:
        result = None
    except HostCommandError as err:
        raise NodeSetupError(f"serving node {node}: nvidia-smi did not run: {err}") from err
    if result is None or result.returncode == _NOT_FOUND_EXIT:
        raise NodeSetupError(
            f"serving node {node}: nvidia-smi not found on the host; install the NVIDIA driver "
            f"(>= {min_major}) or remove the {naming.NODE_LABEL_SERVING} label"
        )
    if not result.ok:
        raise NodeSetupError(
            f"serving node {node}: nvidia-smi failed (exit {result.returncode}): "
            f"{_first_line(result.stdout, result.stderr)}"
        )
    try:
        major = parse_driver_major(result.stdout)
    except NodeSetupError as err:
        raise NodeSetupError(f"serving node {node}: {err}") from None
    version = _first_line(result.stdout)
    if major < min_major:
        raise NodeSetupError(
            f"serving node {node}: NVIDIA driver {version} is too old: {major} < {min_major} "
            "(minDriverVersion); upgrade the driver"
        )
    return version
