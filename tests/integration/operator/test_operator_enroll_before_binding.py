"""Enrollment before binding, the operator's part, through the real operator and API server.

- With `spec.operator.enrollBeforeBinding.enabled`, every published device is stored with
  `bindsToNode: true`, `bindingConditions: [thundercompute.com/Enrolled]` and
  `bindingFailureConditions: [thundercompute.com/EnrollmentFailed]`, and both daemon
  DaemonSets run with `--enroll-before-binding`; passes with no change then make no
  write; turning the setting off rewrites each slice once.
- A claim whose status (written through the status subresource, as the daemon writes
  it) shows EnrollmentFailed True for one of the devices gets that device tainted
  `thundercompute.com/enrollment-refused=<reason>:NoSchedule` within seconds, by the
  ResourceClaim watch, not the next timed pass; the taint stays when the allocation is
  cleared and goes when the cool-down ends, with no write in between.

Writes are counted from the API server's audit log.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s

from hack.testbed.kube import wait_for
from hack.testbed.operator import RESOURCE_API, OperatorEnv

DRIVER = "thundercompute.com"
ENROLLED = "thundercompute.com/Enrolled"
ENROLLMENT_FAILED = "thundercompute.com/EnrollmentFailed"
REFUSED_KEY = "thundercompute.com/enrollment-refused"
BINDING_FIELDS = ("bindsToNode", "bindingConditions", "bindingFailureConditions")
COOLDOWN = 30
DAEMONSETS = ("thunder-dra-daemon", "thunder-dra-daemon-consumer")
PROMPTLY = 10.0
"""Seconds within which a refusal taints its device: far below the 10-minute timer."""


def set_binding(env: OperatorEnv, enabled: bool) -> None:
    env.patch_thundercluster(
        {
            "spec": {
                "operator": {
                    # Passes come from sync(), the claim watch and the cool-down's end only.
                    "reconcileInterval": "10m",
                    "enrollBeforeBinding": {"enabled": enabled, "cooldown": f"{COOLDOWN}s"},
                }
            }
        }
    )
    env.sync()


def refused(env: OperatorEnv, pool: str) -> dict[str, tuple[str, str]]:
    """Device -> (value, timeAdded) of its enrollment-refused taint."""
    return {
        d["name"]: (t["value"], t.get("timeAdded", ""))
        for s in env.slices(pool)
        for d in s["spec"]["devices"]
        for t in d.get("taints") or []
        if t["key"] == REFUSED_KEY
    }


def slice_writes(env: OperatorEnv, mark: int) -> list[tuple[str, str]]:
    return [
        (str(w.get("verb")), str(w.get("requestURI")))
        for w in env.operator_writes(mark, ["resourceslices", "deviceclasses"])
    ]


def daemon_commands(env: OperatorEnv) -> list[list[str]]:
    found = []
    for name in DAEMONSETS:
        ds = env.kube.get("apps/v1", "DaemonSet", name, env.namespace)
        assert ds is not None, f"DaemonSet {name}"
        found.append(list(ds["spec"]["template"]["spec"]["containers"][0]["command"]))
    return found


def claim(name: str, namespace: str, device_class: str) -> dict[str, Any]:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}
        },
    }


def refuse(env: OperatorEnv, namespace: str, name: str, pool: str, device: str) -> None:
    """What the scheduler and the daemon write: the allocation of `device`, then
    EnrollmentFailed True in the claim's status.devices (through the status subresource)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    result = {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}
    status = {
        "allocation": {"devices": {"results": [result]}},
        "devices": [
            {
                "driver": DRIVER,
                "pool": pool,
                "device": device,
                "conditions": [
                    {
                        "type": ENROLLMENT_FAILED,
                        "status": "True",
                        "reason": "MintRefused",
                        "message": "Thunder refused to mint a client: zone at capacity",
                        "lastTransitionTime": now,
                    }
                ],
            }
        ],
    }
    api = k8s.ResourceV1Api(env.kube.api_client)
    api.patch_namespaced_resource_claim_status(name, namespace, {"status": status})


def clear_allocation(env: OperatorEnv, namespace: str, name: str) -> None:
    """What the scheduler does after the failure: the allocation (and its entries) go."""
    api = k8s.ResourceV1Api(env.kube.api_client)
    api.patch_namespaced_resource_claim_status(
        name, namespace, {"status": {"allocation": None, "devices": None}}
    )


def test_binding_conditions_are_published_stored_and_cost_no_write_on_a_quiet_pass(
    env: OperatorEnv,
) -> None:
    zone = env.zone("bind")
    pool = f"{zone}/a6000"
    env.add_zone(zone, [("A6000", 40), ("A6000", 30)])  # two slices: 64 and 6 devices
    env.sync()
    before = {s["metadata"]["name"]: s["spec"]["pool"]["generation"] for s in env.slices(pool)}
    assert len(before) == 2
    assert all("--enroll-before-binding" not in c for c in daemon_commands(env))

    mark = len(env.cluster.audit_events())
    set_binding(env, True)
    writes = slice_writes(env, mark)
    assert sorted(v for v, _ in writes) == ["update", "update"], writes
    stored = env.slices(pool)
    assert {s["metadata"]["name"] for s in stored} == set(before), "same slices"
    assert env.devices(pool) == [f"a6000-{i}" for i in range(70)], "same devices"
    for piece in stored:
        for device in piece["spec"]["devices"]:
            assert device["bindsToNode"] is True, device
            assert device["bindingConditions"] == [ENROLLED]
            assert device["bindingFailureConditions"] == [ENROLLMENT_FAILED]
    commands = daemon_commands(env)
    assert all("--enroll-before-binding" in c for c in commands), commands

    mark = len(env.cluster.audit_events())
    env.sync()
    env.sync()
    assert slice_writes(env, mark) == [], "no write on passes with no change"

    mark = len(env.cluster.audit_events())
    set_binding(env, False)
    writes = slice_writes(env, mark)
    assert sorted(v for v, _ in writes) == ["update", "update"], writes
    for piece in env.slices(pool):
        for device in piece["spec"]["devices"]:
            assert not set(BINDING_FIELDS) & set(device), device
    assert all("--enroll-before-binding" not in c for c in daemon_commands(env))
    mark = len(env.cluster.audit_events())
    env.sync()
    assert slice_writes(env, mark) == []


def test_a_refused_enrollment_taints_its_device_at_once_until_the_cooldown_ends(
    env: OperatorEnv,
) -> None:
    model = f"R{uuid.uuid4().hex[:5]}"
    label = model.lower()
    zone = env.zone("refuse")
    pool = f"{zone}/{label}"
    device = f"{label}-1"
    env.add_zone(zone, [(model, 3)])
    set_binding(env, True)
    try:
        assert env.devices(pool) == [f"{label}-0", f"{label}-1", f"{label}-2"]
        with env.kube.namespace("refuse") as ns:
            env.kube.create(claim("gpu", ns, f"thunder-gpu-{label}"))
            mark = len(env.cluster.audit_events())
            refuse(env, ns, "gpu", pool, device)
            refused_at = time.monotonic()
            wait_for(lambda: refused(env, pool), "the refused device's taint", timeout=PROMPTLY)
            tainted_in = time.monotonic() - refused_at
            taints = refused(env, pool)
            assert list(taints) == [device], taints
            value, added = taints[device]
            assert value == "MintRefused"
            assert added, "the API server stamps timeAdded"
            for piece in env.slices(pool):
                for published in piece["spec"]["devices"]:
                    effects = [(t["key"], t["effect"]) for t in published.get("taints") or []]
                    expected = [(REFUSED_KEY, "NoSchedule")] if published["name"] == device else []
                    assert effects == expected, published
            writes = slice_writes(env, mark)
            assert len(writes) == 1, writes

            # The scheduler clears the allocation; the operator remembers the refusal.
            clear_allocation(env, ns, "gpu")
            mark = len(env.cluster.audit_events())
            env.sync()
            assert refused(env, pool) == taints, "same taint, same timeAdded"
            assert slice_writes(env, mark) == [], "no write while it cools down"

            wait_for(
                lambda: not refused(env, pool),
                "the taint to go when the cool-down ends",
                timeout=COOLDOWN + 20,
            )
            gone_after = time.monotonic() - refused_at
            assert gone_after >= COOLDOWN - 2, f"gone after {gone_after:.1f}s"
            writes = slice_writes(env, mark)
            assert len(writes) == 1, writes
            mark = len(env.cluster.audit_events())
            env.sync()
            assert slice_writes(env, mark) == []
            print(f"tainted in {tainted_in:.1f}s, untainted after {gone_after:.1f}s")
    finally:
        set_binding(env, False)
