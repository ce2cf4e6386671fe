"""The real scheduler allocates devices of a zone pool and binds pods only in that zone.

This is the mechanism the whole driver stands on: one ResourceSlice pool per
zone, whose node selector names the zone, is enough for kube-scheduler to
place a pod on any node of the zone and never on a node of another zone. Run
at the newest version and at emulated 1.34.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from hack.cluster import Cluster, ClusterConfig
from hack.testbed.kube import Kube, wait_for

ZONE_LABEL = "topology.kubernetes.io/zone"
RESOURCE = "resource.k8s.io/v1"


@pytest.fixture(scope="module", params=["1.37", "1.34"])
def versioned(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Kube]]:
    version = str(request.param)
    if version == "1.37":
        cluster: Cluster = request.getfixturevalue("cluster")
        yield version, Kube(cluster.kubeconfig)
        return
    config = ClusterConfig(emulated_version=version)
    with Cluster(workdir=tmp_path_factory.mktemp(f"cp-{version}"), config=config) as c:
        yield version, Kube(c.kubeconfig)


class Zones:
    """Two zones of simulated nodes and one pool of GPUs in zone A, named uniquely."""

    def __init__(self, kube: Kube) -> None:
        self.id = uuid.uuid4().hex[:6]
        self.kube = kube
        self.zone_a = f"zone-a-{self.id}"
        self.zone_b = f"zone-b-{self.id}"
        self.driver = f"proof-{self.id}.thundercompute.com"
        self.device_class = f"proof-gpu-{self.id}"
        self.nodes: dict[str, dict[str, Any]] = {
            f"a1-{self.id}": {"zone": self.zone_a, "serving": True},
            f"a2-{self.id}": {"zone": self.zone_a},
            f"b1-{self.id}": {"zone": self.zone_b, "serving": True},
        }

    def zone_of(self, node: str) -> str:
        zone: str = self.nodes[node]["zone"]
        return zone

    def publish(self, devices: int, extended_resource: str | None = None) -> None:
        spec: dict[str, Any] = {
            "selectors": [{"cel": {"expression": f'device.driver == "{self.driver}"'}}]
        }
        if extended_resource:
            spec["extendedResourceName"] = extended_resource
        self.kube.create(
            {
                "apiVersion": RESOURCE,
                "kind": "DeviceClass",
                "metadata": {"name": self.device_class},
                "spec": spec,
            }
        )
        self.kube.create(
            {
                "apiVersion": RESOURCE,
                "kind": "ResourceSlice",
                "metadata": {"name": f"proof-{self.id}-a6000-0"},
                "spec": {
                    "driver": self.driver,
                    "pool": {
                        "name": f"{self.zone_a}/a6000",
                        "generation": 1,
                        "resourceSliceCount": 1,
                    },
                    "nodeSelector": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": ZONE_LABEL, "operator": "In", "values": [self.zone_a]}
                                ]
                            }
                        ]
                    },
                    "devices": [
                        {
                            "name": f"a6000-{i}",
                            "attributes": {
                                "gpu_type": {"string": "A6000"},
                                "zone": {"string": self.zone_a},
                            },
                        }
                        for i in range(devices)
                    ],
                },
            }
        )

    def cleanup(self) -> None:
        self.kube.delete(RESOURCE, "ResourceSlice", f"proof-{self.id}-a6000-0")
        self.kube.delete(RESOURCE, "DeviceClass", self.device_class)


@pytest.fixture
def zones(versioned: tuple[str, Kube]) -> Iterator[Zones]:
    _, kube = versioned
    z = Zones(kube)
    with kube.nodes(z.nodes):
        try:
            yield z
        finally:
            z.cleanup()


def claim_pod(name: str, template: str, node_zone: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        "containers": [
            {
                "name": "tester",
                "image": "ubuntu:24.04",
                "command": ["sleep", "3600"],
                "resources": {"claims": [{"name": "gpu", "request": "gpu"}]},
            }
        ],
    }
    if node_zone:
        spec["nodeSelector"] = {ZONE_LABEL: node_zone}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def scheduled_node(kube: Kube, ns: str, pod: str) -> str | None:
    obj = kube.get("v1", "Pod", pod, ns)
    return obj["spec"].get("nodeName") if obj else None


def unschedulable(kube: Kube, ns: str, pod: str) -> str | None:
    obj = kube.get("v1", "Pod", pod, ns) or {}
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond["type"] == "PodScheduled" and cond.get("reason") == "Unschedulable":
            return str(cond.get("message", ""))
    return None


def allocated_devices(kube: Kube, ns: str, claim: str) -> list[dict[str, Any]]:
    obj = kube.get(RESOURCE, "ResourceClaim", claim, ns) or {}
    allocation = obj.get("status", {}).get("allocation") or {}
    results: list[dict[str, Any]] = allocation.get("devices", {}).get("results") or []
    return results


def pod_claim_name(kube: Kube, ns: str, pod: str) -> str | None:
    obj = kube.get("v1", "Pod", pod, ns) or {}
    for status in obj.get("status", {}).get("resourceClaimStatuses") or []:
        if status.get("resourceClaimName"):
            return str(status["resourceClaimName"])
    return None


def force_delete(kube: Kube, ns: str, pod: str) -> None:
    # No kubelet confirms termination here, so the pod is removed at once.
    kube.core.delete_namespaced_pod(pod, ns, grace_period_seconds=0)


def test_claims_from_a_zone_pool_land_only_in_that_zone(
    versioned: tuple[str, Kube], zones: Zones
) -> None:
    version, kube = versioned
    zones.publish(devices=4)
    with kube.namespace("proof") as ns:
        kube.create(
            {
                "apiVersion": RESOURCE,
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "gpu-pair", "namespace": ns},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": "gpu",
                                    "exactly": {
                                        "deviceClassName": zones.device_class,
                                        "allocationMode": "ExactCount",
                                        "count": 2,
                                    },
                                }
                            ]
                        }
                    }
                },
            }
        )
        for pod in ("first", "second"):
            kube.create_pod(ns, claim_pod(pod, "gpu-pair"))
        placed = {}
        for pod in ("first", "second"):
            node = wait_for(partial(scheduled_node, kube, ns, pod), f"{version}: {pod} bound")
            assert zones.zone_of(node) == zones.zone_a, f"{pod} landed on {node} outside zone A"
            placed[pod] = node
            claim = wait_for(partial(pod_claim_name, kube, ns, pod), f"{pod}'s claim")
            results = wait_for(partial(allocated_devices, kube, ns, claim), f"{claim} allocated")
            assert len(results) == 2
            assert {r["pool"] for r in results} == {f"{zones.zone_a}/a6000"}
            assert all(r["driver"] == zones.driver for r in results)
        used = {
            r["device"]
            for pod in placed
            for r in allocated_devices(kube, ns, pod_claim_name(kube, ns, pod) or "")
        }
        assert used == {f"a6000-{i}" for i in range(4)}, "each device is allocated once"

        # The pool is exhausted, and zone B has no pool at all.
        kube.create_pod(ns, claim_pod("third", "gpu-pair"))
        kube.create_pod(ns, claim_pod("in-zone-b", "gpu-pair", node_zone=zones.zone_b))
        wait_for(lambda: unschedulable(kube, ns, "third"), "third reported Unschedulable")
        wait_for(lambda: unschedulable(kube, ns, "in-zone-b"), "in-zone-b Unschedulable")

        # Freeing a pair lets the waiting pod in, again in zone A.
        force_delete(kube, ns, "first")
        node = wait_for(lambda: scheduled_node(kube, ns, "third"), "third bound after first left")
        assert zones.zone_of(node) == zones.zone_a
        assert scheduled_node(kube, ns, "in-zone-b") is None


def test_extended_resource_request_gets_a_generated_claim(
    versioned: tuple[str, Kube], zones: Zones
) -> None:
    version, kube = versioned
    if version == "1.34":
        pytest.skip(
            "DRAExtendedResource is alpha in 1.34 and upstream does not support alpha "
            "features under --emulated-version; extended resources need 1.36+ (seed: "
            "Requirements), so this case runs at 1.37 only"
        )
    resource_name = f"proof.thundercompute.com/gpu-{zones.id}"
    zones.publish(devices=2, extended_resource=resource_name)
    with kube.namespace("proof-er") as ns:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "simple"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "tester",
                        "image": "ubuntu:24.04",
                        "command": ["sleep", "3600"],
                        "resources": {"limits": {resource_name: "2"}},
                    }
                ],
            },
        }
        kube.create_pod(ns, pod)
        node = wait_for(lambda: scheduled_node(kube, ns, "simple"), "the pod bound")
        assert zones.zone_of(node) == zones.zone_a

        def generated_claim() -> str | None:
            obj = kube.get("v1", "Pod", "simple", ns) or {}
            status = obj.get("status", {}).get("extendedResourceClaimStatus") or {}
            return status.get("resourceClaimName")

        claim = wait_for(generated_claim, "the scheduler's generated claim in the pod status")
        results = wait_for(lambda: allocated_devices(kube, ns, claim), f"{claim} allocated")
        assert sorted(r["device"] for r in results) == ["a6000-0", "a6000-1"]
        assert kube.get("v1", "Node", node)  # the node exists and never advertised the resource
        node_obj = kube.core.read_node(node)
        assert resource_name not in (node_obj.status.allocatable or {})  # type: ignore[union-attr]
