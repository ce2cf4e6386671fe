"""The operator publishes Thunder inventory: pools, devices, classes, targets, status.

One operator process and one fake Thunder serve the whole module; every test works in
zones of its own, so tests do not depend on each other's state.
"""

from __future__ import annotations

import httpx

from hack.testbed.kube import wait_for
from hack.testbed.operator import OPERATOR_AGENT, OperatorEnv


def pool_status(env: OperatorEnv, pool: str) -> dict[str, object]:
    for entry in env.thundercluster().get("status", {}).get("pools") or []:
        if entry["pool"] == pool:
            found: dict[str, object] = entry
            return found
    return {}


def unbacked(env: OperatorEnv, pool: str) -> dict[str, str]:
    """Device -> the value of its thundercompute.com/unbacked NoSchedule taint."""
    found = {}
    for piece in env.slices(pool):
        for device in piece["spec"]["devices"]:
            for taint in device.get("taints") or []:
                if taint["key"] == "thundercompute.com/unbacked":
                    assert taint["effect"] == "NoSchedule"
                    found[device["name"]] = taint["value"]
    return found


def test_four_a6000_at_target_one_and_a_half_publish_six(env: OperatorEnv) -> None:
    zone = env.zone("first")
    zone_id = env.add_zone(zone, [("A6000", 4)])
    env.fake.admin.set_targets(zone_id, {"A6000": 1.5})
    env.sync()

    pool = f"{zone}/a6000"
    assert env.devices(pool) == [f"a6000-{i}" for i in range(6)]
    (piece,) = env.slices(pool)
    assert piece["metadata"]["labels"]["thundercompute.com/oversubscription"] == "1.5"
    assert piece["spec"]["driver"] == "thundercompute.com"
    assert piece["spec"]["pool"]["resourceSliceCount"] == 1
    terms = piece["spec"]["nodeSelector"]["nodeSelectorTerms"]
    assert len(terms) == 1
    expressions = {e["key"]: e["values"] for e in terms[0]["matchExpressions"]}
    assert expressions == {
        "topology.kubernetes.io/zone": [zone],
        "kubernetes.io/os": ["linux"],
    }, "slices select the zone and the daemon's nodeSelector"
    device = piece["spec"]["devices"][0]
    assert device["attributes"]["thundercompute.com/gpu_type"] == {"string": "A6000"}
    assert device["attributes"]["thundercompute.com/zone"] == {"string": zone}

    device_class = env.device_class("thunder-gpu-a6000")
    assert device_class is not None
    assert device_class["spec"]["extendedResourceName"] == "thundercompute.com/gpu-a6000"
    owners = device_class["metadata"]["ownerReferences"]
    assert [o["name"] for o in owners] == [env.name]

    assert pool_status(env, pool) == {
        "zone": zone,
        "model": "A6000",
        "pool": pool,
        "physical": 4,
        "target": "1.5",
        "published": 6,
        "liveClients": 0,
    }
    assert env.condition("InventorySynced")["status"] == "True"
    assert env.condition("ThunderReachable")["status"] == "True"
    added = " ".join(e["message"] for e in env.events("PoolsAdded"))
    assert pool in added
    assert env.operator.metric("thunder_dra_operator_pool_published_devices", pool=pool) == 6
    # The operator only reads Thunder.
    assert not [w for w in env.fake.admin.writes() if "(operator)" in str(w.get("userAgent"))]


def test_missing_malformed_and_failing_targets_give_one(env: OperatorEnv) -> None:
    missing, malformed, failing = (env.zone(label) for label in ("missing", "malformed", "fail"))
    env.add_zone(missing, [("A6000", 3)])
    malformed_id = env.add_zone(malformed, [("A6000", 3)])
    failing_id = env.add_zone(failing, [("A6000", 3)])
    # Stored as given: a non-numeric model target and a negative default.
    httpx.put(
        f"{env.fake.base_url}/_admin/zones/{malformed_id}/oversubscription-targets",
        json={
            "oversubscriptionTargets": [{"gpuType": "A6000", "oversubscriptionTarget": "lots"}],
            "defaultOversubscriptionTarget": -2,
        },
    ).raise_for_status()
    env.fake.admin.set_targets(failing_id, {"A6000": 3.0})
    fault = env.fake.admin.add_fault(
        f"/api/v1/zones/{failing_id}/oversubscription-targets", status=500
    )
    try:
        env.sync()
    finally:
        httpx.delete(f"{env.fake.base_url}/_admin/faults/{fault}").raise_for_status()

    for zone in (missing, malformed, failing):
        assert env.devices(f"{zone}/a6000") == ["a6000-0", "a6000-1", "a6000-2"], zone
        assert pool_status(env, f"{zone}/a6000")["target"] == "1"
    warnings = [
        r
        for r in env.operator.log_records()
        if r.get("level") == "warning" and r.get("zone") == failing
    ]
    assert any("targets unreadable" in r["message"] for r in warnings)
    assert any(failing in e["message"] for e in env.events("TargetsUnreadable"))


def test_growing_and_shrinking_keep_device_indices(env: OperatorEnv) -> None:
    zone = env.zone("resize")
    zone_id = env.add_zone(zone)
    host = env.fake.admin.add_host(zone_id, "A6000", 4)
    env.sync()
    pool = f"{zone}/a6000"
    assert env.devices(pool) == [f"a6000-{i}" for i in range(4)]
    first_generation = env.slices(pool)[0]["spec"]["pool"]["generation"]

    env.fake.admin.patch_host(host["hostId"], {"gpuCount": 6})
    env.sync()
    assert env.devices(pool) == [f"a6000-{i}" for i in range(6)], "growing adds the next indices"
    assert env.slices(pool)[0]["spec"]["pool"]["generation"] == first_generation + 1

    env.fake.admin.patch_host(host["hostId"], {"gpuCount": 2})
    # Losing more than half is held until the same answer came 3 passes (inventoryProtection):
    # the first held pass taints the 4 devices Thunder no longer backs, the second writes
    # nothing, the third withdraws them.
    env.sync()
    assert env.devices(pool) == [f"a6000-{i}" for i in range(6)], "held, not withdrawn"
    assert unbacked(env, pool) == {f"a6000-{i}": "HostsOffline" for i in range(2, 6)}
    env.sync()
    env.sync()
    assert env.devices(pool) == ["a6000-0", "a6000-1"], "shrinking removes the highest indices"
    assert unbacked(env, pool) == {}
    assert env.slices(pool)[0]["spec"]["pool"]["generation"] == first_generation + 3
    resized = " ".join(e["message"] for e in env.events("PoolsResized"))
    assert f"{pool} 4->6" in resized
    assert f"{pool} 6->2" in resized


def test_pools_of_200_and_2000_devices_are_split_into_slices(env: OperatorEnv) -> None:
    small, large = env.zone("split200"), env.zone("split2000")
    # Hosts of 50: within the per-host cap (maxGPUsPerHost, 64 by default).
    env.add_zone(small, [("H100", 50)] * 4)
    env.add_zone(large, [("H100", 50)] * 40)
    env.sync()

    # 64 devices per slice: the most a slice with a tainted device may hold.
    for zone, devices, slices in ((small, 200, 4), (large, 2000, 32)):
        pool = f"{zone}/h100"
        pieces = env.slices(pool)
        assert len(pieces) == slices, pool
        assert {p["spec"]["pool"]["resourceSliceCount"] for p in pieces} == {slices}
        assert len({p["spec"]["pool"]["generation"] for p in pieces}) == 1
        assert all(len(p["spec"]["devices"]) <= 64 for p in pieces)
        names = env.devices(pool)
        assert names == [f"h100-{i}" for i in range(devices)], "each device once, in order"
        assert pool_status(env, pool)["published"] == devices


def test_a_pass_with_nothing_changed_writes_nothing(env: OperatorEnv) -> None:
    env.add_zone(env.zone("quiet"), [("A6000", 2)])
    env.sync()
    mark = len(env.cluster.audit_events())
    env.sync()
    env.sync()
    writes = env.operator_writes(
        mark, ["resourceslices", "deviceclasses", "daemonsets", "thunderclusters"]
    )
    assert writes == [], [w.get("requestURI") for w in writes]


def test_operator_restart_makes_no_writes(env: OperatorEnv) -> None:
    env.add_zone(env.zone("restart"), [("A6000", 3), ("L4", 130)])
    env.sync()
    published = env.operator_writes(0, ["resourceslices", "deviceclasses"])
    assert published, "the audit filter sees the operator's writes"
    before = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in env.slices()}
    mark = len(env.cluster.audit_events())

    env.operator.restart()
    wait_for(lambda: env.passes_done() >= 1, "the first pass of the new process")
    env.sync()

    writes = env.operator_writes(
        mark, ["resourceslices", "deviceclasses", "daemonsets", "thunderclusters"]
    )
    assert writes == [], [(w.get("verb"), w.get("requestURI")) for w in writes]
    after = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in env.slices()}
    assert after == before


def test_thunder_outage_keeps_every_pool(env: OperatorEnv) -> None:
    zone = env.zone("outage")
    zone_id = env.add_zone(zone, [("A6000", 2)])
    env.sync()
    before = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in env.slices()}
    assert any(s.startswith(f"thunder.{zone}.") for s in before)
    # Thunder loses the host, but cannot be read: nothing may be removed.
    hosts = [h for h in env.fake.admin.state()["hosts"] if h["zoneId"] == zone_id]
    env.fake.admin.delete_host(hosts[0]["hostId"])

    fault = env.fake.admin.add_fault("/api/v1/zones", method="GET", status=503)
    try:
        env.sync()
        after = {s["metadata"]["name"] for s in env.slices()}
        assert after == set(before), "an outage withdraws nothing"
        assert env.devices(f"{zone}/a6000") == ["a6000-0", "a6000-1"]
        assert unbacked(env, f"{zone}/a6000") == {
            "a6000-0": "ThunderUnreachable",
            "a6000-1": "ThunderUnreachable",
        }, "every device is tainted at once"
        reachable = env.condition("ThunderReachable")
        assert reachable["status"] == "False"
        assert reachable["reason"] == "ServerError"
        assert "503" in reachable["message"]
        assert env.condition("InventorySynced")["status"] == "False"
        assert env.condition("Ready")["status"] == "False"
        assert env.events("ThunderUnreachable")
        assert env.operator.metric("thunder_dra_operator_thunder_reachable") == 0
    finally:
        httpx.delete(f"{env.fake.base_url}/_admin/faults/{fault}").raise_for_status()

    # Hosts unreadable in every zone: zones are listed but every pool is kept.
    fault = env.fake.admin.add_fault("/api/v1/hosts", method="GET", status=502)
    try:
        env.sync()
        assert env.devices(f"{zone}/a6000") == ["a6000-0", "a6000-1"], "the zone keeps its pool"
        assert set(unbacked(env, f"{zone}/a6000").values()) == {"ZoneUnreadable"}
        assert env.condition("ThunderReachable")["reason"] == "ZonesUnreadable"
    finally:
        httpx.delete(f"{env.fake.base_url}/_admin/faults/{fault}").raise_for_status()

    # A vanished pool is held until the same answer came 3 passes (inventoryProtection).
    for _ in range(3):
        env.sync()
    assert env.condition("ThunderReachable")["status"] == "True"
    assert env.slices(f"{zone}/a6000") == [], "once Thunder is read again, the retired pool goes"
    assert any(zone in e["message"] for e in env.events("PoolsRemoved"))


def test_the_operator_identifies_itself_and_reads_only(env: OperatorEnv) -> None:
    env.sync()
    agents = {
        str(event.get("userAgent"))
        for event in env.operator_writes(0, ["resourceslices", "deviceclasses"])
    }
    assert agents
    assert all(agent.startswith(OPERATOR_AGENT) for agent in agents)
    assert all(agent.endswith("(operator)") for agent in agents)
