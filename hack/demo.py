"""`make demo`: the driver's scheduling path on a throwaway local control plane.

    python -m hack.demo

Starts etcd, kube-apiserver, kube-scheduler and kube-controller-manager,
simulates three nodes in two zones, publishes a zone pool of GPUs and shows
the real scheduler allocating them to a ResourceClaim and to an
extended-resource request, only on nodes of the pool's zone. Everything it
starts is stopped on exit.
"""

from __future__ import annotations

import subprocess
import sys
import time
from functools import partial
from typing import Any

from hack.cluster import Cluster
from tests.support.kube import Kube, wait_for

ZONE_LABEL = "topology.kubernetes.io/zone"
RESOURCE = "resource.k8s.io/v1"
DRIVER = "thundercompute.com"
BOLD, DIM, RESET = ("\033[1m", "\033[2m", "\033[0m") if sys.stdout.isatty() else ("", "", "")


def step(title: str) -> None:
    print(f"\n{BOLD}== {title}{RESET}", flush=True)


def kubectl(cluster: Cluster, *args: str) -> None:
    print(f"{DIM}$ kubectl {' '.join(args)}{RESET}", flush=True)
    subprocess.run(
        [str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", *args],
        check=True,
    )


def pool_objects() -> list[dict[str, Any]]:
    labels = {"app.kubernetes.io/name": "thunder-dra-driver"}
    device_class = {
        "apiVersion": RESOURCE,
        "kind": "DeviceClass",
        "metadata": {
            "name": "thunder-gpu-a6000",
            "labels": {**labels, "app.kubernetes.io/component": "device-class"},
        },
        "spec": {
            "extendedResourceName": "thundercompute.com/gpu-a6000",
            "selectors": [
                {
                    "cel": {
                        "expression": f'device.driver == "{DRIVER}" && '
                        f'device.attributes["{DRIVER}"].gpu_type == "A6000"'
                    }
                }
            ],
        },
    }
    selector = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": ZONE_LABEL, "operator": "In", "values": ["zone-a"]}]}
        ]
    }
    slice_ = {
        "apiVersion": RESOURCE,
        "kind": "ResourceSlice",
        "metadata": {
            "name": "thunder-zone-a-a6000-0",
            "labels": {
                **labels,
                "app.kubernetes.io/component": "resource-inventory",
                "thundercompute.com/oversubscription": "1.5",
            },
        },
        "spec": {
            "driver": DRIVER,
            "pool": {"name": "zone-a/a6000", "generation": 1, "resourceSliceCount": 1},
            "nodeSelector": selector,
            "devices": [
                {
                    "name": f"a6000-{i}",
                    "attributes": {
                        "gpu_type": {"string": "A6000"},
                        "zone": {"string": "zone-a"},
                    },
                }
                for i in range(6)
            ],
        },
    }
    return [device_class, slice_]


def claim_template(ns: str) -> dict[str, Any]:
    return {
        "apiVersion": RESOURCE,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "thunder-pod-gpu", "namespace": ns},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "thunder-gpu-a6000",
                                "allocationMode": "ExactCount",
                                "count": 2,
                            },
                        }
                    ]
                }
            }
        },
    }


def pod(name: str, resources: dict[str, Any], claims: list[dict[str, str]] | None) -> Any:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "tester",
                "image": "ubuntu:24.04",
                "command": ["bash", "-lc", "nvidia-smi && sleep 3600"],
                "resources": resources,
            }
        ],
    }
    if claims:
        spec["resourceClaims"] = claims
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def main() -> int:
    started = time.monotonic()
    step("Starting the local control plane (etcd, apiserver, scheduler, controller-manager)")
    with Cluster() as cluster:
        print(f"up in {time.monotonic() - started:.1f}s at {cluster.server}")
        kube = Kube(cluster.kubeconfig)

        step("Simulated nodes: two in zone-a, one in zone-b")
        with kube.nodes(
            {
                "node-a1": {"zone": "zone-a", "serving": True},
                "node-a2": {"zone": "zone-a"},
                "node-b1": {"zone": "zone-b", "serving": True},
            }
        ):
            kubectl(cluster, "get", "nodes", "-L", ZONE_LABEL, "-L", "thundercompute.com/node")

            step("A zone pool: 4 A6000 at oversubscription 1.5 publish 6 devices")
            for obj in pool_objects():
                kube.create(obj)
            kubectl(
                cluster, "get", "deviceclasses", "-l", "app.kubernetes.io/name=thunder-dra-driver",
                "-o", "custom-columns=CLASS:.metadata.name,RESOURCE:.spec.extendedResourceName",
            )  # fmt: skip
            kubectl(
                cluster, "get", "resourceslices", "-l", "app.kubernetes.io/name=thunder-dra-driver",
                "-o", "custom-columns=POOL:.spec.pool.name,DEVICES:.spec.devices[*].name,"
                "TARGET:.metadata.labels.thundercompute\\.com/oversubscription",
            )  # fmt: skip

            with kube.namespace("demo") as ns:
                step("A pod with a ResourceClaimTemplate for 2 GPUs, and one with limits")
                kube.create(claim_template(ns))
                kube.create_pod(
                    ns,
                    pod(
                        "thunder-pod-gpu",
                        {"claims": [{"name": "gpu", "request": "gpu"}]},
                        [{"name": "gpu", "resourceClaimTemplateName": "thunder-pod-gpu"}],
                    ),
                )
                kube.create_pod(
                    ns,
                    pod("thunder-simple", {"limits": {"thundercompute.com/gpu-a6000": "2"}}, None),
                )
                for name in ("thunder-pod-gpu", "thunder-simple"):
                    wait_for(partial(node_of, kube, ns, name), f"{name} to be scheduled")
                wait_for(lambda: len(allocated(kube, ns)) == 2, "both claims allocated")
                kubectl(cluster, "-n", ns, "get", "pods", "-o", "wide")
                kubectl(
                    cluster, "-n", ns, "get", "resourceclaims", "-o",
                    "custom-columns=CLAIM:.metadata.name,POOLS:.status.allocation.devices.results[*].pool,"
                    "DEVICES:.status.allocation.devices.results[*].device",
                )  # fmt: skip
                print(
                    "\nBoth pods landed in zone-a, the only zone with a pool; "
                    "node-b1 (zone-b) was never chosen."
                )
    step(f"Done in {time.monotonic() - started:.1f}s; every process stopped")
    return 0


def node_of(kube: Kube, ns: str, name: str) -> str | None:
    obj = kube.get("v1", "Pod", name, ns) or {}
    node = obj.get("spec", {}).get("nodeName")
    return str(node) if node else None


def allocated(kube: Kube, ns: str) -> list[str]:
    return [
        c["metadata"]["name"]
        for c in kube.list_objects(RESOURCE, "ResourceClaim", namespace=ns)
        if (c.get("status") or {}).get("allocation")
    ]


if __name__ == "__main__":
    raise SystemExit(main())
