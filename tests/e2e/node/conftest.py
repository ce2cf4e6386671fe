"""Fixtures of the real-node tests: a control plane a node can join, the node, the images.

Everything here needs root and the node components (``hack/build-node-tools.sh``);
the tests skip with the reason where they cannot run, except on a host with only cgroup
v2, where the launcher's `NodeError` says what the host needs and the tests error
(`hack.node.launcher.require_cgroup_v1`). The control plane and the node
are package-scoped (this folder is a package): they are built once for the folder's
tests and stopped when its last test ends, not kept running, idle, through the rest of
`make test`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack import image as image_builder
from hack.cluster import Cluster
from hack.cluster.launcher import binaries
from hack.node import chart
from hack.node.launcher import (
    SYSCTLS,
    Node,
    leftovers,
    node_cluster_config,
    node_tools,
    node_unavailable,
    one_node_at_a_time,
)


def node_skip_reason() -> str | None:
    why = node_unavailable(node_tools())
    return why or image_builder.unavailable()


@pytest.fixture(scope="session")
def node_images() -> dict[str, image_builder.BuiltImage]:
    why = node_skip_reason()
    if why:
        pytest.skip(why)
    return chart.node_images(binaries() / "kubectl")


@pytest.fixture(scope="package")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    why = node_skip_reason()
    if why:
        pytest.skip(why)
    with Cluster(
        workdir=tmp_path_factory.mktemp("node-control-plane"), config=node_cluster_config()
    ) as cluster:
        yield cluster


@pytest.fixture(scope="package")
def real_node(
    node_cluster: Cluster, node_images: dict[str, image_builder.BuiltImage]
) -> Iterator[Node]:
    # A serving node (zone, role) whose fake host tools trust the cluster CA.
    config = chart.node_config_for_chart(
        node_cluster.ca_cert, tuple(i.archive for i in node_images.values())
    )
    with one_node_at_a_time():
        before = _sysctls()
        with Node(node_cluster, config) as node:
            workdir = node.workdir
            yield node
        assert _sysctls() == before, "the node did not restore the kernel settings"
        assert not workdir.exists()
        assert leftovers() == [], "the node left these behind"


def _sysctls() -> dict[str, str]:
    values = {}
    for name in SYSCTLS:
        path = Path("/proc/sys") / name
        if path.exists():
            values[name] = path.read_text().strip()
    return values


def run_pod(node: Node, manifest: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    """Create a pod and wait until it has finished; returns its final state."""
    name = manifest["metadata"]["name"]
    ns = manifest["metadata"].get("namespace", "default")
    path = node.workdir / f"pod-{ns}-{name}.yaml"
    path.write_text(yaml.safe_dump(manifest))
    node.kubectl("apply", "-f", str(path))
    deadline = time.monotonic() + timeout
    pod: dict[str, Any] = {}
    while time.monotonic() < deadline:
        pod = json.loads(node.kubectl("get", "pod", "-n", ns, name, "-o", "json"))
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return pod
        time.sleep(0.5)
    events = node.kubectl("get", "events", "-n", ns, "-o", "wide", check=False)
    raise AssertionError(f"pod {ns}/{name} did not finish: {pod.get('status')}\n{events}")


def pod_logs(node: Node, name: str, namespace: str = "default") -> str:
    return node.kubectl("logs", "-n", namespace, name)


def stock_pod(name: str, image: str, script: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", script],
                    **spec.pop("container", {}),
                }
            ],
            **spec,
        },
    }
