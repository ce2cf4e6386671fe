"""What the operator publishes is what the real scheduler allocates from.

A model no zone served before becomes requestable within one pass, through a
ResourceClaim and through its extended resource; devices allocated to claims survive
a shrink; a retired model loses its class and pool while allocated claims stay
allocated.
"""

from __future__ import annotations

import uuid
from typing import Any

from hack.testbed.kube import wait_for
from hack.testbed.operator import RESOURCE_API, OperatorEnv


def claim(name: str, device_class: str, count: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": device_class,
                            "allocationMode": "ExactCount",
                            "count": count,
                        },
                    }
                ]
            }
        },
    }


def pod(
    name: str, *, claim_name: str | None = None, limits: dict[str, str] | None = None
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "tester",
        "image": "ubuntu:24.04",
        "command": ["sleep", "inf"],
    }
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if claim_name:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    if limits:
        container["resources"] = {"limits": limits}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def allocation(env: OperatorEnv, namespace: str, name: str) -> list[dict[str, Any]]:
    obj = env.kube.get(RESOURCE_API, "ResourceClaim", name, namespace) or {}
    results: list[dict[str, Any]] = ((obj.get("status") or {}).get("allocation") or {}).get(
        "devices", {}
    ).get("results") or []
    return results


def bound_node(env: OperatorEnv, namespace: str, name: str) -> str | None:
    obj = env.kube.get("v1", "Pod", name, namespace) or {}
    node: str | None = (obj.get("spec") or {}).get("nodeName")
    return node


def test_a_new_model_is_requestable_and_retiring_it_keeps_allocated_claims(
    env: OperatorEnv,
) -> None:
    model = f"X{uuid.uuid4().hex[:5]}"
    label = model.lower()
    zone = env.zone("sched")
    device_class = f"thunder-gpu-{label}"
    extended = f"thundercompute.com/gpu-{label}"
    node = f"node-{label}"
    assert env.device_class(device_class) is None

    with env.kube.nodes({node: {"zone": zone, "serving": True}}), env.kube.namespace("sched") as ns:
        zone_id = env.add_zone(zone, [(model, 2)])
        env.sync()
        published = env.device_class(device_class)
        assert published is not None, "one pass makes the new model requestable"
        assert published["spec"]["extendedResourceName"] == extended

        # Through a ResourceClaim.
        env.kube.create(
            {**claim("by-claim", device_class), "metadata": {"name": "by-claim", "namespace": ns}}
        )
        env.kube.create_pod(ns, pod("claimer", claim_name="by-claim"))
        assert wait_for(lambda: bound_node(env, ns, "claimer"), "the claim's pod bound") == node
        (result,) = wait_for(lambda: allocation(env, ns, "by-claim"), "by-claim allocated")
        assert result["pool"] == f"{zone}/{label}"
        assert result["driver"] == "thundercompute.com"

        # Through the extended resource: the scheduler makes the claim itself.
        env.kube.create_pod(ns, pod("limits", limits={extended: "1"}))
        assert (
            wait_for(lambda: bound_node(env, ns, "limits"), "the extended-resource pod bound")
            == node
        )

        def generated() -> str | None:
            obj = env.kube.get("v1", "Pod", "limits", ns) or {}
            status = (obj.get("status") or {}).get("extendedResourceClaimStatus") or {}
            name: str | None = status.get("resourceClaimName")
            return name

        generated_claim = wait_for(generated, "the generated claim")
        (second,) = wait_for(
            lambda: allocation(env, ns, generated_claim), "generated claim allocated"
        )
        allocated = {result["device"], second["device"]}
        assert allocated == {f"{label}-0", f"{label}-1"}

        # Thunder shrinks the zone to one GPU: both devices are allocated, neither goes.
        host = next(h for h in env.fake.admin.state()["hosts"] if h["zoneId"] == zone_id)
        env.fake.admin.patch_host(host["hostId"], {"gpuCount": 1})
        env.sync()
        assert env.devices(f"{zone}/{label}") == sorted(allocated)

        # The model leaves Thunder entirely: the allocated devices, their pool and class stay.
        env.fake.admin.delete_host(host["hostId"])
        for _ in range(3):
            env.sync()
        assert env.device_class(device_class) is not None
        assert env.devices(f"{zone}/{label}") == sorted(allocated)
        assert allocation(env, ns, "by-claim") == [result]
        assert allocation(env, ns, generated_claim) == [second]

        # New pods of the retired model stay Pending rather than failing.
        env.kube.create(
            {**claim("late", device_class), "metadata": {"name": "late", "namespace": ns}}
        )
        env.kube.create_pod(ns, pod("late", claim_name="late"))

        def unschedulable() -> bool:
            obj = env.kube.get("v1", "Pod", "late", ns) or {}
            conditions = (obj.get("status") or {}).get("conditions") or []
            return any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions)

        wait_for(unschedulable, "the late pod reported unschedulable")
        assert bound_node(env, ns, "late") is None
        for name in ("claimer", "limits", "late"):
            env.kube.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
