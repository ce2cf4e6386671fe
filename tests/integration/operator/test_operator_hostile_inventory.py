"""Hostile Thunder answers and a spec the webhook never saw, through the real operator.

- a shrinking answer (an empty zone list with HTTP 200, a zone that vanishes, a pool
  losing more than `maxShrinkPercent`) is held until it repeats `confirmPasses` passes,
  with a Warning and `InventorySuspect`, the devices it would withdraw tainted at once
  (`thundercompute.com/unbacked`, NoSchedule); devices allocated to a ResourceClaim are never
  withdrawn, nor their pool and DeviceClass;
- vendor numbers above `spec.operator.limits` are clamped with a Warning; a host
  reporting 5,000,000 GPUs publishes `maxGPUsPerHost` devices, the operator keeps
  answering its probes and stops on SIGTERM;
- an invalid spec (written while the webhook was down) is reported in `SpecValid` with
  its field path, and the last valid spec keeps being served.

The module's ThunderCluster runs with a 24h reconcile interval, so every pass is one
the test asked for and passes can be counted.
"""

from __future__ import annotations

import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from hack.testbed.kube import wait_for
from hack.testbed.operator import RESOURCE_API, OperatorEnv

DRIVER = "thundercompute.com"


@pytest.fixture(scope="module", autouse=True)
def passes_on_request_only(env: OperatorEnv) -> None:
    env.patch_thundercluster({"spec": {"operator": {"reconcileInterval": "24h"}}})
    env.sync()


@pytest.fixture
def namespace(env: OperatorEnv) -> Iterator[str]:
    with env.kube.namespace("hostile") as ns:
        yield ns


def new_model() -> tuple[str, str]:
    model = f"S{uuid.uuid4().hex[:6]}"
    return model, model.lower()


def versions(env: OperatorEnv, pools: list[str]) -> dict[str, str]:
    return {
        s["metadata"]["name"]: s["metadata"]["resourceVersion"]
        for pool in pools
        for s in env.slices(pool)
    }


def allocate(env: OperatorEnv, namespace: str, name: str, pool: str, device: str) -> None:
    """A ResourceClaim allocated one device of `pool`, as the scheduler records it."""
    env.kube.create(
        {
            "apiVersion": RESOURCE_API,
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "unused"}}]}
            },
        }
    )
    k8s.CustomObjectsApi(env.kube.api_client).patch_namespaced_custom_object_status(
        "resource.k8s.io",
        "v1",
        namespace,
        "resourceclaims",
        name,
        {
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}
                        ]
                    }
                }
            }
        },
    )


def unbacked(env: OperatorEnv, pool: str) -> dict[str, str]:
    """Device -> the value of its thundercompute.com/unbacked NoSchedule taint."""
    return {
        device["name"]: taint["value"]
        for piece in env.slices(pool)
        for device in piece["spec"]["devices"]
        for taint in device.get("taints") or []
        if taint["key"] == "thundercompute.com/unbacked" and taint["effect"] == "NoSchedule"
    }


def suspect(env: OperatorEnv) -> dict[str, Any]:
    return env.condition("InventorySuspect")


def test_an_empty_zone_list_is_held_until_confirmed_and_allocated_devices_stay(
    env: OperatorEnv, namespace: str
) -> None:
    model, label = new_model()
    held_zone, gone_zone = env.zone("empty-a"), env.zone("empty-b")
    env.add_zone(held_zone, [(model, 4)])
    env.add_zone(gone_zone, [(model, 2)])
    env.sync()
    held_pool, gone_pool = f"{held_zone}/{label}", f"{gone_zone}/{label}"
    assert env.devices(held_pool) == [f"{label}-{i}" for i in range(4)]
    allocate(env, namespace, "holder", held_pool, f"{label}-3")
    before = versions(env, [held_pool, gone_pool])

    env.fake.admin.add_fault("/api/v1/zones", method="GET", status=200, body={"zones": []})
    try:
        env.sync()
        # Held, not withdrawn: the devices are tainted at once, the slices keep them.
        assert env.devices(held_pool) == [f"{label}-{i}" for i in range(4)]
        assert env.devices(gone_pool) == [f"{label}-0", f"{label}-1"]
        assert versions(env, [held_pool, gone_pool]).keys() == before.keys()
        for pool in (held_pool, gone_pool):
            assert set(unbacked(env, pool).values()) == {"ZoneNotListed"}, pool
            assert len(unbacked(env, pool)) == len(env.devices(pool)), pool
        before = versions(env, [held_pool, gone_pool])
        condition = suspect(env)
        assert condition["status"] == "True", condition
        for name in (held_pool, gone_pool, held_zone, gone_zone):
            assert name in condition["message"]
        assert "1/3" in condition["message"]
        warnings = [e for e in env.events("InventorySuspect") if e["type"] == "Warning"]
        assert any(gone_pool in e["message"] for e in warnings)

        env.sync()
        assert versions(env, [held_pool, gone_pool]) == before, "2 of 3 passes: still held"
        assert "2/3" in suspect(env)["message"]

        env.sync()  # the third pass with the same answer: applied
        assert env.slices(gone_pool) == []
        assert env.devices(held_pool) == [f"{label}-3"], "the allocated device stays"
        assert unbacked(env, held_pool) == {f"{label}-3": "ZoneNotListed"}, "tainted"
        assert env.device_class(f"thunder-gpu-{label}") is not None, "and its DeviceClass"
        assert suspect(env)["status"] == "False"
        assert any(gone_pool in e["message"] for e in env.events("InventoryShrinkConfirmed"))
    finally:
        env.fake.admin.clear_faults()

    env.sync()
    assert env.devices(gone_pool) == [f"{label}-0", f"{label}-1"], "growing is applied at once"
    assert unbacked(env, held_pool) == {}, "backed again: the taint goes"


def test_a_vanished_zone_and_a_halved_pool_are_held_a_small_shrink_is_not(
    env: OperatorEnv,
) -> None:
    model, label = new_model()
    vanishing, shrinking = env.zone("vanish"), env.zone("shrink")
    vanishing_id = env.add_zone(vanishing, [(model, 2)])
    shrinking_id = env.add_zone(shrinking)
    host = env.fake.admin.add_host(shrinking_id, model, 8)
    env.sync()
    vanishing_pool, shrinking_pool = f"{vanishing}/{label}", f"{shrinking}/{label}"
    assert len(env.devices(shrinking_pool)) == 8

    state = env.fake.admin.state()
    state["zones"] = [z for z in state["zones"] if z["zoneId"] != vanishing_id]
    state["hosts"] = [h for h in state["hosts"] if h["zoneId"] != vanishing_id]
    env.fake.admin.replace_state(state)
    env.fake.admin.patch_host(host["hostId"], {"gpuCount": 3})  # 8 -> 3: loses 62%
    env.sync()
    env.sync()
    assert env.devices(vanishing_pool) == [f"{label}-0", f"{label}-1"]
    assert len(env.devices(shrinking_pool)) == 8
    message = suspect(env)["message"]
    assert f"zone {vanishing!r} is no longer listed" in message
    assert f"{shrinking_pool} 8->3" in message

    env.fake.admin.patch_host(host["hostId"], {"gpuCount": 2})  # another answer: counts anew
    env.sync()
    assert len(env.devices(shrinking_pool)) == 8
    assert env.slices(vanishing_pool) == [], "the vanished zone was confirmed on pass 3"
    env.sync()
    env.sync()
    assert env.devices(shrinking_pool) == [f"{label}-0", f"{label}-1"]
    assert suspect(env)["status"] == "False"

    env.fake.admin.patch_host(host["hostId"], {"gpuCount": 1})  # loses 50%: not more
    env.sync()
    assert env.devices(shrinking_pool) == [f"{label}-0"]


def test_an_invalid_spec_is_reported_and_the_last_valid_one_served(env: OperatorEnv) -> None:
    env.sync()
    # Accepted by the CRD schema, refused by the operator's own validation (the webhook
    # would refuse it too, but this cluster runs without it).
    bad = "example.com/" + "a" * 50
    env.patch_thundercluster({"spec": {"operator": {"extendedResourcePrefix": bad}}})
    try:
        model, label = new_model()
        zone = env.zone("invalid")
        env.add_zone(zone, [(model, 2)])
        env.sync()
        condition = env.condition("SpecValid")
        assert condition["status"] == "False", condition
        assert "spec.operator.extendedResourcePrefix" in condition["message"]
        assert any(
            "spec.operator.extendedResourcePrefix" in e["message"]
            for e in env.events("InvalidSpec")
        )
        assert env.devices(f"{zone}/{label}") == [f"{label}-0", f"{label}-1"], (
            "inventory is still published with the last valid spec"
        )
        published = env.device_class(f"thunder-gpu-{label}")
        assert published is not None
        assert published["spec"]["extendedResourceName"] == f"thundercompute.com/gpu-{label}"
        assert env.operator.popen is not None
        assert env.operator.popen.poll() is None
    finally:
        env.patch_thundercluster({"spec": {"operator": {"extendedResourcePrefix": None}}})
    env.sync()
    assert env.condition("SpecValid")["status"] == "True"


def healthz(env: OperatorEnv) -> int:
    url = f"http://127.0.0.1:{env.operator.health_port}/healthz"
    with urllib.request.urlopen(url, timeout=10) as response:
        status: int = response.status
    return status


def test_vendor_numbers_are_clamped_and_a_huge_host_is_survived(env: OperatorEnv) -> None:
    model, label = new_model()
    zone = env.zone("clamp")
    zone_id = env.add_zone(zone, [(model, 100), (model, 100)])
    pool = f"{zone}/{label}"
    env.patch_thundercluster(
        {"spec": {"operator": {"limits": {"maxGPUsPerHost": 8, "maxDevicesPerPool": 12}}}}
    )
    try:
        env.sync()
        assert len(env.devices(pool)) == 12, "2 hosts x 8 GPUs, clamped to 12 per pool"
        clamped = " ".join(e["message"] for e in env.events("InventoryClamped"))
        assert "maxGPUsPerHost=8" in clamped
        assert "maxDevicesPerPool=12" in clamped
        assert f"{pool} 16->12" in clamped
        assert all(e["type"] == "Warning" for e in env.events("InventoryClamped"))
    finally:
        env.patch_thundercluster({"spec": {"operator": {"limits": None}}})

    huge_model, huge_label = new_model()
    env.fake.admin.add_host(zone_id, huge_model, 5_000_000)
    env.sync()
    assert len(env.devices(f"{zone}/{huge_label}")) == 64, "maxGPUsPerHost defaults to 64"
    assert healthz(env) == 200
    assert "maxGPUsPerHost=64" in " ".join(e["message"] for e in env.events("InventoryClamped"))

    code = env.operator.stop()
    assert code == 0, f"the operator stops cleanly on SIGTERM, exit code {code}"
    env.operator.start()
    wait_for(lambda: env.passes_done() >= 1, "the restarted operator's first pass")
