"""A pod waiting for tainted Thunder devices is told so in its events.

Through the real operator, API server, scheduler and controller-manager: a pod asks for
a Thunder GPU through a ResourceClaimTemplate (the resourceclaim controller makes its
claim, owned by the pod) while Thunder cannot be read, so every device of the zone
carries `thundercompute.com/unbacked`. The scheduler only says "cannot allocate all
claims"; the operator's next pass records `ThunderDevicesTainted` on the claim and on
the pod, naming the taint, the zone and the reason. A pod asking for another driver's
class gets nothing from the operator.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from hack.testbed.kube import wait_for
from hack.testbed.operator import RESOURCE_API, OperatorEnv

REASON = "ThunderDevicesTainted"


def template(name: str, namespace: str, device_class: str) -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": device_class}}
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def pod(name: str, template_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name}],
            "containers": [
                {
                    "name": "tester",
                    "image": "ubuntu:24.04",
                    "command": ["sleep", "inf"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def events(env: OperatorEnv, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
    items = env.kube.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind={kind},involvedObject.name={name}"
    ).items
    found = [env.kube.api_client.sanitize_for_serialization(e) for e in items]
    return [e for e in found if e.get("reason") == REASON]


def claim_of(env: OperatorEnv, namespace: str, pod_name: str) -> str | None:
    obj = env.kube.get("v1", "Pod", pod_name, namespace) or {}
    statuses = (obj.get("status") or {}).get("resourceClaimStatuses") or []
    name = statuses[0].get("resourceClaimName") if statuses else None
    return str(name) if name else None


def test_a_pod_waiting_for_tainted_devices_gets_an_event_naming_the_taint(
    env: OperatorEnv,
) -> None:
    model = f"N{uuid.uuid4().hex[:5]}"
    label = model.lower()
    zone = env.zone("notice")
    node = f"node-{label}"
    with env.kube.nodes({node: {"zone": zone, "serving": True}}), env.kube.namespace("note") as ns:
        env.add_zone(zone, [(model, 1)])
        env.sync()
        env.kube.create(template("gpu", ns, f"thunder-gpu-{label}"))
        env.kube.create(template("other", ns, "gpu.other.example.com"))
        fault = env.fake.admin.add_fault("/api/v1/zones", method="GET", status=503)
        try:
            env.sync()
            env.kube.create_pod(ns, pod("waits", "gpu"))
            env.kube.create_pod(ns, pod("elsewhere", "other"))
            claim = wait_for(lambda: claim_of(env, ns, "waits"), "the pod's claim made")
            wait_for(lambda: claim_of(env, ns, "elsewhere"), "the other pod's claim made")
            env.sync()
            on_pod = wait_for(lambda: events(env, ns, "Pod", "waits"), "the pod's event")
            message = on_pod[0]["message"]
            print(f"the pod's {REASON} event: {message}")
            assert on_pod[0]["type"] == "Warning"
            assert "thundercompute.com/unbacked:NoSchedule" in message
            assert f"{zone} (ThunderUnreachable)" in message
            assert f"thunder-gpu-{label}" in message
            assert events(env, ns, "ResourceClaim", claim)[0]["message"] == message
            assert events(env, ns, "Pod", "elsewhere") == []
        finally:
            httpx.delete(f"{env.fake.base_url}/_admin/faults/{fault}").raise_for_status()
        env.sync()
        for name in ("waits", "elsewhere"):
            env.kube.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
