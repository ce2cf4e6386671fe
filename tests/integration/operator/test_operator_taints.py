"""Device taints from Thunder's view, through the real operator, API server and scheduler.

- Thunder unreachable: at the next pass every published device carries
  `thundercompute.com/unbacked=ThunderUnreachable:NoSchedule`; nothing is withdrawn, a
  claim allocated before keeps its device and its pod stays bound, a new pod stays
  Pending (the scheduler cannot allocate a tainted device); a pass with no change then
  makes no write (the stored `timeAdded` is carried back); when Thunder is back the
  taints go and the pending pod is scheduled.
- A zone whose hosts cannot be read: its 200 devices are tainted `ZoneUnreadable`, in
  the same 4 slices of 64; when it is read again, the taints go. The API server takes a
  slice of 64 devices with a taint and refuses 65 (the limit the layout is chosen for).
- An admin's DeviceTaintRule is never touched, and its taint never written into the
  operator's slices.

Writes are counted from the API server's audit log.
"""

from __future__ import annotations

import subprocess
import uuid
from typing import Any

import httpx
import pytest
from kubernetes.dynamic.exceptions import DynamicApiError

from hack.testbed.kube import wait_for
from hack.testbed.operator import RESOURCE_API, OperatorEnv

TAINT_KEY = "thundercompute.com/unbacked"


def unbacked(env: OperatorEnv, pool: str) -> dict[str, tuple[str, str]]:
    """Device -> (value, timeAdded) of its thundercompute.com/unbacked taint."""
    found = {}
    for piece in env.slices(pool):
        for device in piece["spec"]["devices"]:
            taints = device.get("taints") or []
            assert len(taints) <= 1, device
            for taint in taints:
                assert (taint["key"], taint["effect"]) == (TAINT_KEY, "NoSchedule"), taint
                assert taint.get("timeAdded"), "the API server stamps every taint"
                found[device["name"]] = (taint["value"], taint["timeAdded"])
    return found


def layout(env: OperatorEnv, pool: str) -> dict[str, list[str]]:
    """Slice name -> its device names."""
    return {
        s["metadata"]["name"]: [d["name"] for d in s["spec"]["devices"]] for s in env.slices(pool)
    }


def claim(name: str, namespace: str, device_class: str) -> dict[str, Any]:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}
        },
    }


def pod(name: str, claim_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
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


def bound_node(env: OperatorEnv, namespace: str, name: str) -> str | None:
    obj = env.kube.get("v1", "Pod", name, namespace) or {}
    node: str | None = (obj.get("spec") or {}).get("nodeName")
    return node


def allocated_device(env: OperatorEnv, namespace: str, name: str) -> str | None:
    obj = env.kube.get(RESOURCE_API, "ResourceClaim", name, namespace) or {}
    results = ((obj.get("status") or {}).get("allocation") or {}).get("devices", {}).get(
        "results"
    ) or []
    return str(results[0]["device"]) if results else None


def unschedulable_message(env: OperatorEnv, namespace: str, name: str) -> str | None:
    obj = env.kube.get("v1", "Pod", name, namespace) or {}
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition["status"] == "False":
            return str(condition.get("message") or condition.get("reason"))
    return None


def test_thunder_unreachable_taints_every_device_new_pods_pend_running_pods_stay(
    env: OperatorEnv,
) -> None:
    model = f"T{uuid.uuid4().hex[:5]}"
    label = model.lower()
    zone = env.zone("outage")
    node = f"node-{label}"
    pool = f"{zone}/{label}"
    with env.kube.nodes({node: {"zone": zone, "serving": True}}), env.kube.namespace("taint") as ns:
        env.add_zone(zone, [(model, 2)])
        env.sync()
        before = layout(env, pool)
        assert unbacked(env, pool) == {}
        env.kube.create(claim("running", ns, f"thunder-gpu-{label}"))
        env.kube.create_pod(ns, pod("running", "running"))
        assert wait_for(lambda: bound_node(env, ns, "running"), "the running pod bound") == node
        held = wait_for(lambda: allocated_device(env, ns, "running"), "its claim allocated")

        fault = env.fake.admin.add_fault("/api/v1/zones", method="GET", status=503)
        try:
            env.sync()
            taints = unbacked(env, pool)
            assert {v for v, _ in taints.values()} == {"ThunderUnreachable"}
            assert sorted(taints) == [f"{label}-0", f"{label}-1"], "every device, at once"
            assert layout(env, pool) == before, "the same slices hold the same devices"
            assert env.condition("ThunderReachable")["status"] == "False"

            # No change, taints present: no write, and timeAdded as first stamped.
            mark = len(env.cluster.audit_events())
            env.sync()
            writes = env.operator_writes(mark, ["resourceslices", "deviceclasses"])
            assert writes == [], [(w.get("verb"), w.get("requestURI")) for w in writes]
            assert unbacked(env, pool) == taints

            # Running pods are untouched; a new pod stays Pending, not ContainerCreating.
            assert bound_node(env, ns, "running") == node
            assert allocated_device(env, ns, "running") == held
            env.kube.create(claim("late", ns, f"thunder-gpu-{label}"))
            env.kube.create_pod(ns, pod("late", "late"))
            message = wait_for(
                lambda: unschedulable_message(env, ns, "late"), "the late pod unschedulable"
            )
            assert bound_node(env, ns, "late") is None, message
            print(f"the late pod's PodScheduled=False message: {message}")
            assert "cannot allocate all claims" in message
            assert allocated_device(env, ns, "late") is None
        finally:
            httpx.delete(f"{env.fake.base_url}/_admin/faults/{fault}").raise_for_status()

        env.sync()
        assert unbacked(env, pool) == {}, "Thunder is back: the taints go"
        assert layout(env, pool) == before
        assert wait_for(lambda: bound_node(env, ns, "late"), "the pending pod scheduled") == node
        for name in ("running", "late"):
            env.kube.core.delete_namespaced_pod(name, ns, grace_period_seconds=0)


def test_an_unreadable_zone_is_tainted_in_place_and_untainted_when_read(env: OperatorEnv) -> None:
    zone = env.zone("unread")
    pool = f"{zone}/a6000"
    # 200 devices in 4 slices of 64: tainting them all moves none (the API allows a
    # slice with a tainted device at most 64).
    env.add_zone(zone, [("A6000", 50)] * 4)
    env.sync()
    before = layout(env, pool)
    assert sorted(len(devices) for devices in before.values()) == [8, 64, 64, 64]

    # Hosts unreadable: zones are listed, but none can be counted.
    fault = env.fake.admin.add_fault("/api/v1/hosts", method="GET", status=502)
    try:
        env.sync()
        taints = unbacked(env, pool)
        assert {name: value for name, (value, _) in taints.items()} == {
            f"a6000-{i}": "ZoneUnreadable" for i in range(200)
        }
        assert layout(env, pool) == before, "nothing withdrawn, nothing moved"
        assert any("tainted" in e["message"] for e in env.events("ZoneUnreadable"))
        # The command docs/when-thunder-fails.md gives users, as it prints.
        shown = subprocess.run(
            [
                str(env.cluster.bin_dir / "kubectl"),
                f"--kubeconfig={env.cluster.kubeconfig}",
                "get",
                "resourceslices",
                "-l",
                "app.kubernetes.io/name=thunder-dra-driver",
                "-o",
                "jsonpath={range .items[*]}{.spec.pool.name}:{range .spec.devices[*]} "
                '{.name}={.taints[*].value}{end}{"\\n"}{end}',
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        for devices in before.values():
            expected = " ".join(f"{name}=ZoneUnreadable" for name in devices)
            assert f"{pool}: {expected}" in shown.splitlines(), shown

        mark = len(env.cluster.audit_events())
        env.sync()
        assert env.operator_writes(mark, ["resourceslices"]) == []
        assert unbacked(env, pool) == taints
    finally:
        httpx.delete(f"{env.fake.base_url}/_admin/faults/{fault}").raise_for_status()

    env.sync()
    assert unbacked(env, pool) == {}
    assert layout(env, pool) == before


def test_a_device_taint_rule_is_left_alone(env: OperatorEnv) -> None:
    zone = env.zone("drain")
    pool = f"{zone}/a6000"
    env.add_zone(zone, [("A6000", 2)])
    env.sync()
    name = f"drain-{zone}"
    rule = env.kube.create(
        {
            "apiVersion": RESOURCE_API,
            "kind": "DeviceTaintRule",
            "metadata": {"name": name},
            "spec": {
                "deviceSelector": {"driver": "thundercompute.com", "pool": pool},
                "taint": {
                    "key": "example.com/drain",
                    "value": "maintenance",
                    "effect": "NoSchedule",
                },
            },
        }
    )
    try:
        mark = len(env.cluster.audit_events())
        env.sync()
        env.sync()
        assert env.operator_writes(mark, ["devicetaintrules", "resourceslices"]) == []
        stored = env.kube.get(RESOURCE_API, "DeviceTaintRule", name)
        assert stored is not None
        assert stored["metadata"]["resourceVersion"] == rule["metadata"]["resourceVersion"]
        assert unbacked(env, pool) == {}, "the rule's taint is not written into the slices"
    finally:
        env.kube.delete(RESOURCE_API, "DeviceTaintRule", name)


def test_the_api_server_allows_64_devices_in_a_slice_with_a_taint_and_no_more(
    env: OperatorEnv,
) -> None:
    """The limit the 64-device layout is chosen for, as the pinned API server applies it."""

    def body(name: str, count: int) -> dict[str, Any]:
        devices: list[dict[str, Any]] = [{"name": f"d-{i}"} for i in range(count)]
        devices[0]["taints"] = [{"key": TAINT_KEY, "value": "HostsOffline", "effect": "NoSchedule"}]
        return {
            "apiVersion": RESOURCE_API,
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": "limits.example.com",
                "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                "allNodes": True,
                "devices": devices,
            },
        }

    try:
        created = env.kube.create(body("taint-limit-64", 64))
        assert created["spec"]["devices"][0]["taints"][0]["timeAdded"], "stamped"
        with pytest.raises(DynamicApiError) as refused:
            env.kube.create(body("taint-limit-65", 65))
        assert refused.value.status == 422
        assert "64" in str(refused.value.body)
    finally:
        for name in ("taint-limit-64", "taint-limit-65"):
            env.kube.delete(RESOURCE_API, "ResourceSlice", name)
