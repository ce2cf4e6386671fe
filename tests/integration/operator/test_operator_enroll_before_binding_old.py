"""On an API server without DRADeviceBindingConditions (emulated 1.34 and 1.35, where it is
alpha and off), enrollment before binding turned on costs nothing: the operator finds
bindsToNode and the binding conditions dropped by a dry run, says so once, and publishes
devices without them: no rewrite pass after pass, nor after a restart."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hack.fake_thunder import FakeThunderProcess
from hack.testbed.kube import wait_for
from hack.testbed.operator import OperatorEnv, operator_env_on_emulated

BINDING_FIELDS = ("bindsToNode", "bindingConditions", "bindingFailureConditions")


@pytest.fixture(scope="module", params=["1.34", "1.35"])
def env(
    request: pytest.FixtureRequest,
    fake_thunder: FakeThunderProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorEnv]:
    version = str(request.param)
    workdir = tmp_path_factory.mktemp(f"old-{version}")
    with operator_env_on_emulated(version, fake_thunder, workdir) as made:
        assert not made.cluster.config.feature_gates.get("DRADeviceBindingConditions"), (
            "off, as stock"
        )
        yield made


def binding_fields(env: OperatorEnv, pool: str) -> list[str]:
    return [
        key
        for s in env.slices(pool)
        for d in s["spec"]["devices"]
        for key in BINDING_FIELDS
        if key in d
    ]


def slice_writes(env: OperatorEnv, mark: int) -> list[tuple[str, str]]:
    return [
        (str(w.get("verb")), str(w.get("requestURI")))
        for w in env.operator_writes(mark, ["resourceslices", "deviceclasses"])
    ]


def test_dropped_binding_conditions_are_reported_once_and_never_rewritten(
    env: OperatorEnv,
) -> None:
    zone = env.zone("oldbind")
    pool = f"{zone}/a6000"
    env.add_zone(zone, [("A6000", 2)])
    env.sync()
    mark = len(env.cluster.audit_events())
    env.patch_thundercluster({"spec": {"operator": {"enrollBeforeBinding": {"enabled": True}}}})
    env.sync()
    # The pass's dry run of a slice with binding conditions found them dropped.
    (event,) = env.events("DeviceBindingUnsupported")
    assert event["type"] == "Warning"
    assert any(r.get("reason") == "DeviceBindingUnsupported" for r in env.operator.log_records())
    assert slice_writes(env, mark) == [], "nothing to rewrite: the fields are not published"
    assert binding_fields(env, pool) == []

    env.sync()
    env.sync()
    assert slice_writes(env, mark) == []
    (again,) = env.events("DeviceBindingUnsupported")
    assert again.get("count", 1) == 1, "reported once"

    env.operator.restart()
    wait_for(lambda: env.passes_done() >= 1, "the restarted operator's first pass")
    env.sync()
    assert slice_writes(env, mark) == []
    assert env.devices(pool) == ["a6000-0", "a6000-1"]
