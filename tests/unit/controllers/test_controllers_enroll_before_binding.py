"""Enrollment before binding, the operator's part: the devices' binding conditions when
the setting is on (and none when off), the cool-down taint of a device whose enrollment
Thunder refused (it comes at once and goes after the cool-down, with no other write),
the daemon's flag, the setting's bounds, and an API server that drops the fields."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.support.fakekube import Address, FakeKube
from tests.support.operator_pass import (
    OperatorWorld,
    operator_world,
)
from tests.unit.controllers.test_controllers_diff import FakeApiServer
from thunder_dra.api import syntax
from thunder_dra.api.duration import Duration
from thunder_dra.api.thundercluster import EnrollBeforeBindingSpec, ThunderClusterSpec
from thunder_dra.controllers.inventory.binding import (
    REFUSED_DEFAULT_VALUE,
    REFUSED_TAINT_KEY,
    Refusals,
    binding_dropped,
    failed_devices,
    refused_value,
)
from thunder_dra.controllers.inventory.capacity import (
    HostInventory,
    OversubscriptionTargets,
    ZoneInventory,
    compute_capacity,
)
from thunder_dra.controllers.inventory.plan import plan_resource_slices
from thunder_dra.controllers.inventory.slices import DesiredPool, InventoryConfig, build_pools
from thunder_dra.controllers.inventory.taints import TAINT_KEY
from thunder_dra.controllers.shared.ownership import ThunderClusterRef
from thunder_dra.controllers.workload.daemonset import Role, daemon_command
from thunder_dra.kube.binding import ENROLLED, ENROLLMENT_FAILED
from thunder_dra.webhooks.validation import validate_thundercluster

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
DRIVER = "thundercompute.com"
ON = {"operator": {"enrollBeforeBinding": {"enabled": True, "cooldown": "30s"}}}


def spec(**binding: Any) -> ThunderClusterSpec:
    return ThunderClusterSpec.model_validate({"operator": {"enrollBeforeBinding": binding}})


def pool(config: InventoryConfig, devices: int = 3, **changes: Any) -> DesiredPool:
    zone = ZoneInventory(
        "id-z", "us-east", (HostInventory("A6000", devices),), (), OversubscriptionTargets()
    )
    (built,) = build_pools(compute_capacity([zone]), config).pools
    return replace(built, **changes)


def devices_of(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(body["spec"]["devices"])


def claim(
    uid: str,
    device: str,
    *,
    status: str = "True",
    reason: str = "ThunderRefused",
    since: str = "2026-12-02T12:00:00Z",
    driver: str = DRIVER,
) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "name": f"claim-{uid}", "namespace": "default"},
        "status": {
            "devices": [
                {
                    "driver": driver,
                    "pool": "us-east/a6000",
                    "device": device,
                    "conditions": [
                        {
                            "type": ENROLLMENT_FAILED,
                            "status": status,
                            "reason": reason,
                            "message": "Thunder refused the mint",
                            "lastTransitionTime": since,
                        }
                    ],
                }
            ]
        },
    }


# -- the setting ---------------------------------------------------------------------


def test_the_setting_is_off_by_default_with_a_two_minute_cooldown() -> None:
    default = ThunderClusterSpec().operator.enroll_before_binding
    assert default == EnrollBeforeBindingSpec(enabled=False, cooldown=Duration("2m"))
    assert spec(enabled=True, cooldown="30s").operator.enroll_before_binding.enabled
    assert spec(cooldown="1h").operator.enroll_before_binding.cooldown == "1h"


@pytest.mark.parametrize("cooldown", ["29s", "61m", "2h", "0s", "soon"])
def test_a_cooldown_outside_30s_to_1h_is_refused_by_the_model_and_the_webhook(
    cooldown: str,
) -> None:
    with pytest.raises(ValidationError):
        spec(enabled=True, cooldown=cooldown)
    obj = {
        "metadata": {"name": "main"},
        "spec": {"operator": {"enrollBeforeBinding": {"cooldown": cooldown}}},
    }
    (error,) = validate_thundercluster(obj)
    assert str(error).startswith("spec.operator.enrollBeforeBinding.cooldown"), str(error)


def test_the_webhook_takes_the_setting_on() -> None:
    obj = {"metadata": {"name": "main"}, "spec": ON}
    assert validate_thundercluster(obj) == []


# -- the daemon's flag -----------------------------------------------------------------


@pytest.mark.parametrize("role", list(Role))
def test_both_daemon_roles_get_the_flag_only_while_the_setting_is_on(role: Role) -> None:
    assert "--enroll-before-binding" not in daemon_command(ThunderClusterSpec(), role)
    assert "--enroll-before-binding" in daemon_command(spec(enabled=True), role)
    assert "--enroll-before-binding" not in daemon_command(spec(enabled=False), role)


# -- the published devices -------------------------------------------------------------


def test_devices_carry_binds_to_node_and_the_conditions_only_when_on() -> None:
    on = InventoryConfig.from_spec(spec(enabled=True), owner=ThunderClusterRef("t", "u"))
    off = InventoryConfig.from_spec(ThunderClusterSpec(), owner=ThunderClusterRef("t", "u"))
    assert on.enroll_before_binding
    assert not off.enroll_before_binding
    for device in devices_of(pool(on).manifest(pool(on).slices[0], 1)):
        assert device["bindsToNode"] is True
        assert device["bindingConditions"] == [ENROLLED]
        assert device["bindingFailureConditions"] == [ENROLLMENT_FAILED]
        assert "taints" not in device
    for device in devices_of(pool(off).manifest(pool(off).slices[0], 1)):
        assert not {"bindsToNode", "bindingConditions", "bindingFailureConditions"} & set(device)


def test_the_conditions_are_valid_and_do_not_overlap() -> None:
    for name in (ENROLLED, ENROLLMENT_FAILED):
        assert syntax.is_qualified_name(name), name
    assert len({ENROLLED, ENROLLMENT_FAILED}) == 2


def test_turning_the_setting_on_or_off_rewrites_the_pool_once_and_keeps_its_layout() -> None:
    off = InventoryConfig(max_devices_per_slice=2)
    on = InventoryConfig(max_devices_per_slice=2, enroll_before_binding=True)
    stored = pool(off, 5).manifests(1)
    assert plan_resource_slices([pool(off, 5)], stored).actions == ()
    turned_on = plan_resource_slices([pool(on, 5)], stored)
    assert {a.name for a in turned_on.actions} == {b["metadata"]["name"] for b in stored}
    written = [a.body for a in turned_on.actions]  # type: ignore[union-attr]
    assert [[d["name"] for d in devices_of(b)] for b in written] == [
        [d["name"] for d in devices_of(b)] for b in stored
    ], "same slices, same devices"
    assert plan_resource_slices([pool(on, 5)], written).actions == (), "then no write"
    assert len(plan_resource_slices([pool(off, 5)], written).actions) == 3


def test_a_dropped_binding_is_told_apart() -> None:
    on = pool(InventoryConfig(enroll_before_binding=True))
    sent = on.manifest(on.slices[0], 1)
    stripped = {
        **sent,
        "spec": {
            **sent["spec"],
            "devices": [{"name": d["name"]} for d in devices_of(sent)],
        },
    }
    assert binding_dropped(sent, stripped)
    assert not binding_dropped(sent, sent)
    off = pool(InventoryConfig())
    plain = off.manifest(off.slices[0], 1)
    assert not binding_dropped(plain, plain)


# -- the cool-down ----------------------------------------------------------------------


def test_a_refusal_is_read_from_the_claims_status_for_its_device() -> None:
    assert failed_devices(claim("u1", "a6000-1")) == {
        (DRIVER, "us-east/a6000", "a6000-1"): ("ThunderRefused", "2026-12-02T12:00:00Z")
    }
    assert failed_devices(claim("u1", "a6000-1", status="False")) == {}
    assert failed_devices({"status": {"devices": "junk"}}) == {}
    assert failed_devices({"status": {"devices": [{"pool": 3}, "x"]}}) == {}


def test_a_refused_value_is_a_label_value() -> None:
    assert refused_value("MintRefused") == "MintRefused"
    assert refused_value("Quota:Exceeded,Zone") == "Quota-Exceeded-Zone"
    assert refused_value("x" * 300) == "x" * 63
    assert refused_value("") == REFUSED_DEFAULT_VALUE
    assert refused_value(None) == REFUSED_DEFAULT_VALUE
    assert refused_value(",:") == REFUSED_DEFAULT_VALUE


def test_a_refusal_cools_its_device_down_once_and_is_forgotten_after() -> None:
    refusals = Refusals()
    cooldown = timedelta(seconds=30)
    assert refusals.observe(claim("u1", "a6000-1"), NOW)
    assert not refusals.observe(claim("u1", "a6000-1"), NOW + timedelta(seconds=5)), (
        "the same failure seen again is not a new refusal"
    )
    assert refusals.observe(claim("u2", "a6000-2", driver="other.example.com"), NOW)
    active = refusals.active(DRIVER, cooldown, NOW + timedelta(seconds=10))
    assert active == {"us-east/a6000": (("a6000-1", "ThunderRefused"),)}
    assert refusals.seconds_left(DRIVER, cooldown, NOW + timedelta(seconds=10)) == 20
    # The scheduler clears the allocation: the claim no longer shows it, the cool-down stays.
    assert not refusals.observe({"metadata": {"uid": "u1"}, "status": {}}, NOW)
    assert refusals.active(DRIVER, cooldown, NOW + timedelta(seconds=29)) != {}
    assert refusals.active(DRIVER, cooldown, NOW + timedelta(seconds=30)) == {}
    assert refusals.seconds_left(DRIVER, cooldown, NOW + timedelta(seconds=31)) is None


def test_a_new_refusal_of_the_same_claim_starts_the_cooldown_again() -> None:
    refusals = Refusals()
    cooldown = timedelta(seconds=30)
    refusals.observe(claim("u1", "a6000-1", since="2026-12-02T12:00:00Z"), NOW)
    later = NOW + timedelta(seconds=25)
    assert refusals.observe(claim("u1", "a6000-1", since="2026-12-02T12:00:25Z"), later)
    assert refusals.seconds_left(DRIVER, cooldown, later) == 30
    assert refusals.observe(claim("u1", "a6000-1"), later, deleted=True) is False


def test_a_published_refused_taint_is_adopted_from_its_time_added() -> None:
    refusals = Refusals()
    body = {
        "spec": {
            "driver": DRIVER,
            "pool": {"name": "us-east/a6000"},
            "devices": [
                {
                    "name": "a6000-2",
                    "taints": [
                        {
                            "key": REFUSED_TAINT_KEY,
                            "value": "MintRefused",
                            "effect": "NoSchedule",
                            "timeAdded": "2026-12-02T11:59:50Z",
                        }
                    ],
                }
            ],
        }
    }
    refusals.adopt(DRIVER, [body], NOW)
    assert refusals.seconds_left(DRIVER, timedelta(seconds=30), NOW) == 20
    assert refusals.active(DRIVER, timedelta(seconds=30), NOW) == {
        "us-east/a6000": (("a6000-2", "MintRefused"),)
    }


def test_the_cooldown_taint_sits_beside_the_unbacked_taint_and_keeps_time_added() -> None:
    config = InventoryConfig(enroll_before_binding=True)
    plain = pool(config)
    tainted = pool(
        config, taints=(("a6000-1", "HostsOffline"),), refused=(("a6000-1", "MintRefused"),)
    )
    stored = plain.manifests(1)
    first = plan_resource_slices([tainted], stored)
    assert len(first.actions) == 1
    body = first.actions[0].body  # type: ignore[union-attr]
    (device,) = [d for d in devices_of(body) if d.get("taints")]
    assert [(t["key"], t["value"], t["effect"]) for t in device["taints"]] == [
        (TAINT_KEY, "HostsOffline", "NoSchedule"),
        (REFUSED_TAINT_KEY, "MintRefused", "NoSchedule"),
    ]
    # The API server stamps timeAdded; carried back, the next pass writes nothing.
    for taint in device["taints"]:
        taint["timeAdded"] = "2026-12-02T12:00:00Z"
    assert plan_resource_slices([tainted], [body]).actions == ()
    gone = plan_resource_slices([replace(tainted, refused=())], [body])
    (update,) = gone.actions
    (kept,) = [d for d in devices_of(update.body) if d.get("taints")]  # type: ignore[union-attr]
    assert kept["taints"] == [
        {
            "key": TAINT_KEY,
            "value": "HostsOffline",
            "effect": "NoSchedule",
            "timeAdded": "2026-12-02T12:00:00Z",
        }
    ], "the other taint keeps its timeAdded"


# -- through the operator's pass ---------------------------------------------------------


class StampingKube(FakeKube):
    """An in-memory apiserver that stamps a taint's timeAdded, as the real one does, and
    drops the binding fields when told to (DRADeviceBindingConditions off)."""

    drop_binding = False

    def _stamp(self, obj: Any) -> None:
        for device in (obj.get("spec") or {}).get("devices") or []:
            for taint in device.get("taints") or []:
                taint.setdefault("timeAdded", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
            if self.drop_binding:
                for key in ("bindsToNode", "bindingConditions", "bindingFailureConditions"):
                    device.pop(key, None)

    def _store(self, address: Address, stored: Any, new: Any) -> Any:
        if address.plural == "resourceslices":
            self._stamp(new)
        return super()._store(address, stored, new)

    def _create(self, address: Address, body: Any, *, dry_run: bool) -> Any:
        if address.plural == "resourceslices" and isinstance(body, dict):
            self._stamp(body)
        return super()._create(address, body, dry_run=dry_run)


@contextlib.asynccontextmanager
async def world_with(
    zones: Mapping[str, Mapping[str, int]], spec: Mapping[str, Any], *, drop_binding: bool = False
) -> AsyncIterator[OperatorWorld]:
    apiserver = StampingKube()
    apiserver.drop_binding = drop_binding
    async with operator_world(zones, spec, apiserver=apiserver) as world:
        yield world


def refused_taints(world: OperatorWorld) -> dict[str, str]:
    return {
        d["name"]: t["value"]
        for s in world.slices()
        for d in s["spec"]["devices"]
        for t in d.get("taints") or []
        if t["key"] == REFUSED_TAINT_KEY
    }


async def test_a_refused_enrollment_taints_its_device_then_the_taint_goes() -> None:
    async with world_with({"us-east": {"A6000": 3}}, ON) as world:
        await world.run_pass()
        assert all(d.get("bindingConditions") for s in world.slices() for d in s["spec"]["devices"])
        quiet = await world.run_pass()
        assert quiet.writes_to("resourceslices") == [], "no write on a pass with no change"
        inventory = world.operator.services.inventory
        assert inventory.observe_claim(claim("u1", "a6000-1"))
        tainting = await world.run_pass()
        assert len(tainting.writes_to("resourceslices")) == 1
        assert refused_taints(world) == {"a6000-1": "ThunderRefused"}
        assert tainting.delay <= 30.5, "the loop wakes when the cool-down ends"
        assert (await world.run_pass()).writes_to("resourceslices") == []
        # A restarted operator keeps the cool-down, from the taint's timeAdded.
        await world.restart()
        assert (await world.run_pass()).writes_to("resourceslices") == []
        assert refused_taints(world) == {"a6000-1": "ThunderRefused"}
        inventory = world.operator.services.inventory
        # The cool-down ends (moved into the past rather than waited for).
        for key, refusal in list(inventory.refusals._refusals.items()):
            inventory.refusals._refusals[key] = type(refusal)(
                refusal.value, refusal.since - timedelta(seconds=31)
            )
        untainting = await world.run_pass()
        assert len(untainting.writes_to("resourceslices")) == 1
        assert refused_taints(world) == {}
        assert (await world.run_pass()).writes_to("resourceslices") == []


async def test_refusals_are_ignored_while_the_setting_is_off() -> None:
    async with world_with({"us-east": {"A6000": 3}}, {}) as world:
        await world.run_pass()
        world.operator.services.inventory.observe_claim(claim("u1", "a6000-1"))
        report = await world.run_pass()
        assert report.writes_to("resourceslices") == []
        assert refused_taints(world) == {}
        assert not any("bindsToNode" in d for s in world.slices() for d in s["spec"]["devices"])


async def test_a_server_that_drops_binding_conditions_is_reported_once_and_not_fought() -> None:
    async with world_with({"us-east": {"A6000": 3}}, ON, drop_binding=True) as world:
        first = await world.run_pass()
        assert any("dryRun" in dict(r.query) for r in first.requests if r.method == "POST")
        assert world.events().count(("Warning", "DeviceBindingUnsupported")) == 1
        assert world.operator.services.inventory.binding_supported is False
        for _ in range(3):
            again = await world.run_pass()
            assert again.writes_to("resourceslices") == [], "no rewrite in a loop"
        assert world.events().count(("Warning", "DeviceBindingUnsupported")) == 1
        assert not any("bindsToNode" in d for s in world.slices() for d in s["spec"]["devices"])


async def test_a_write_that_loses_its_binding_turns_it_off_when_no_probe_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with world_with({"us-east": {"A6000": 3}}, ON, drop_binding=True) as world:
        inventory = world.operator.services.inventory

        async def no_probe(*_: Any) -> None:
            return None

        monkeypatch.setattr(inventory, "_learn_binding_support", no_probe)
        first = await world.run_pass()
        assert len(first.writes_to("resourceslices")) == 1, "tried once"
        assert inventory.binding_supported is False
        assert ("Warning", "DeviceBindingUnsupported") in world.events()
        assert (await world.run_pass()).writes_to("resourceslices") == []


# -- property: cool-downs coming and going over passes -----------------------------------


def layout_of(slices: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {s["metadata"]["name"]: [d["name"] for d in s["spec"]["devices"]] for s in slices}


def stamps(slices: list[dict[str, Any]]) -> dict[tuple[str, str, str], str]:
    return {
        (d["name"], t["key"], t["value"]): t["timeAdded"]
        for s in slices
        for d in s["spec"]["devices"]
        for t in d.get("taints") or []
    }


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(min_value=1, max_value=150),
    binding=st.booleans(),
    passes=st.lists(
        st.tuples(
            st.sets(st.integers(min_value=0, max_value=149), max_size=6),
            st.integers(min_value=0, max_value=150),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_cooldowns_and_unbacked_taints_over_passes_keep_layout_and_time_added(
    size: int, binding: bool, passes: list[tuple[set[int], int]]
) -> None:
    config = InventoryConfig(enroll_before_binding=binding)
    server = FakeApiServer()
    base = pool(config, size)
    server.apply(plan_resource_slices([base], []).actions)
    first_layout = layout_of(server.list("ResourceSlice"))
    for refused_indices, backed in passes:
        names = base.devices
        refused = tuple((names[i], "MintRefused") for i in sorted(refused_indices) if i < size)
        unbacked = tuple((name, "HostsOffline") for name in names[backed:])
        wanted = replace(base, taints=unbacked, refused=refused)
        before = server.list("ResourceSlice")
        server.apply(plan_resource_slices([wanted], before).actions)
        after = server.list("ResourceSlice")
        assert layout_of(after) == first_layout, "taints never lay the pool out again"
        kept, now = stamps(before), stamps(after)
        for key, added in now.items():
            if key in kept:
                assert kept[key] == added, f"timeAdded of {key} restamped"
        assert plan_resource_slices([wanted], after).actions == (), "the same again: no write"
        for device in (d for s in after for d in s["spec"]["devices"]):
            assert ("bindingConditions" in device) is binding
            keys = [t["key"] for t in device.get("taints") or []]
            assert len(keys) == len(set(keys)), device


def test_refusals_of_another_driver_are_forgotten_after_the_longest_cooldown() -> None:
    refusals = Refusals()
    refusals.observe(claim("u1", "a6000-1", driver="other.example.com"), NOW)
    assert len(refusals) == 1
    assert refusals.active(DRIVER, timedelta(seconds=30), NOW + timedelta(minutes=59)) == {}
    assert len(refusals) == 1
    refusals.active(DRIVER, timedelta(seconds=30), NOW + timedelta(hours=1))
    assert len(refusals) == 0
