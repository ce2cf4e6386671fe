"""Upgrading to the model-first DeviceClass selector, through the real operator and
the real scheduler.

A class as earlier releases wrote it (driver test first) is rewritten by the
operator's next pass; a claim allocated under the old class keeps its allocation and
its pod; new claims allocate under the new selector, also with another driver's
device (without this driver's attributes) in front of ours in the allocator's order.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from hack.testbed.kube import wait_for
from hack.testbed.operator import RESOURCE_API, OperatorEnv
from thunder_dra.controllers.deviceclasses import selector_expression

FOREIGN_DRIVER = "a-nic.example.com"  # sorts before thundercompute.com: walked first


def claim(name: str, namespace: str, device_class: str) -> dict[str, Any]:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": device_class, "count": 1}}
                ]
            }
        },
    }


def pod(name: str, claim_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "tester",
                    "image": "ubuntu:24.04",
                    "command": ["sleep", "inf"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
        },
    }


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


def selectors(env: OperatorEnv, name: str) -> list[dict[str, Any]]:
    found = env.device_class(name) or {}
    return list((found.get("spec") or {}).get("selectors") or [])


def test_an_old_form_class_is_rewritten_and_allocated_claims_stay(env: OperatorEnv) -> None:
    model = f"S{uuid.uuid4().hex[:5]}"
    label = model.lower()
    zone = env.zone("selector")
    device_class = f"thunder-gpu-{label}"
    node = f"node-{label}"
    old_form = (
        'device.driver == "thundercompute.com" && '
        f'device.attributes["thundercompute.com"].gpu_type_label == {json.dumps(label)}'
    )
    new_form = selector_expression("thundercompute.com", label)
    foreign = f"foreign-{label}"
    classes = env.kube.resource(RESOURCE_API, "DeviceClass")

    with env.kube.nodes({node: {"zone": zone, "serving": True}}), env.kube.namespace("sel") as ns:
        env.kube.create(
            {
                "apiVersion": RESOURCE_API,
                "kind": "ResourceSlice",
                "metadata": {"name": foreign},
                "spec": {
                    "driver": FOREIGN_DRIVER,
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": "nic-0"}],
                },
            }
        )
        try:
            env.add_zone(zone, [(model, 2)])
            env.sync()
            assert selectors(env, device_class) == [{"cel": {"expression": new_form}}]

            # The class as an earlier release left it; a claim allocated under it.
            classes.patch(
                name=device_class,
                body={"spec": {"selectors": [{"cel": {"expression": old_form}}]}},
                content_type="application/merge-patch+json",
            )
            assert selectors(env, device_class) == [{"cel": {"expression": old_form}}]
            env.kube.create(claim("before", ns, device_class))
            env.kube.create_pod(ns, pod("before", "before"))
            assert wait_for(lambda: bound_node(env, ns, "before"), "pod bound") == node
            (before,) = wait_for(lambda: allocation(env, ns, "before"), "claim allocated")
            assert before["driver"] == "thundercompute.com"
            claim_version = (env.kube.get(RESOURCE_API, "ResourceClaim", "before", ns) or {})[
                "metadata"
            ]["resourceVersion"]

            # The upgraded operator's pass rewrites the class, and only the class.
            mark = len(env.cluster.audit_events())
            env.sync()
            assert selectors(env, device_class) == [{"cel": {"expression": new_form}}]
            writes = env.operator_writes(mark, ["deviceclasses", "resourceclaims", "pods"])
            assert [(w["verb"], w["objectRef"]["name"]) for w in writes] == [
                ("update", device_class)
            ]
            after = env.kube.get(RESOURCE_API, "ResourceClaim", "before", ns) or {}
            assert after["metadata"]["resourceVersion"] == claim_version
            assert allocation(env, ns, "before") == [before]
            assert bound_node(env, ns, "before") == node

            # A new claim allocates the other device under the new selector, which the
            # allocator also evaluated on the foreign device without an error.
            env.kube.create(claim("after", ns, device_class))
            env.kube.create_pod(ns, pod("after", "after"))
            assert wait_for(lambda: bound_node(env, ns, "after"), "second pod bound") == node
            (second,) = wait_for(lambda: allocation(env, ns, "after"), "second claim allocated")
            assert {before["device"], second["device"]} == {f"{label}-0", f"{label}-1"}
            assert second["pool"] == f"{zone}/{label}"
        finally:
            for name in ("before", "after"):
                env.kube.delete("v1", "Pod", name, ns)
            env.kube.delete(RESOURCE_API, "ResourceSlice", foreign)
