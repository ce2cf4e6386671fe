"""On an API server without DRADeviceTaints (emulated 1.34 and 1.35, where it is off), the
operator finds device taints dropped by a dry run, says so once, and publishes none:
an unreadable zone then costs no write, pass after pass, nor after a restart."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from hack.fake_thunder import FakeThunderProcess
from hack.testbed.kube import wait_for
from hack.testbed.operator import OperatorEnv, operator_env_on_emulated


@pytest.fixture(scope="module", params=["1.34", "1.35"])
def env(
    request: pytest.FixtureRequest,
    fake_thunder: FakeThunderProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorEnv]:
    version = str(request.param)
    workdir = tmp_path_factory.mktemp(f"old-{version}")
    with operator_env_on_emulated(version, fake_thunder, workdir) as made:
        assert not made.cluster.config.feature_gates.get("DRADeviceTaints"), "off, as stock"
        yield made


def taints(env: OperatorEnv, pool: str) -> list[object]:
    return [
        d.get("taints") for s in env.slices(pool) for d in s["spec"]["devices"] if d.get("taints")
    ]


def test_dropped_taints_are_reported_once_and_never_rewritten(env: OperatorEnv) -> None:
    zone = env.zone("oldtaint")
    pool = f"{zone}/a6000"
    env.add_zone(zone, [("A6000", 2)])
    env.sync()
    # The first pass's dry run of a tainted slice found the field dropped.
    (event,) = env.events("DeviceTaintsUnsupported")
    assert event["type"] == "Warning"
    assert any(r.get("reason") == "DeviceTaintsUnsupported" for r in env.operator.log_records()), (
        "and a warning log"
    )

    fault = env.fake.admin.add_fault("/api/v1/hosts", method="GET", status=502)
    try:
        mark = len(env.cluster.audit_events())
        env.sync()  # the zone is unreadable: its devices would be tainted on 1.37
        env.sync()
        writes = env.operator_writes(mark, ["resourceslices", "deviceclasses"])
        assert writes == [], [(w.get("verb"), w.get("requestURI")) for w in writes]
        assert env.devices(pool) == ["a6000-0", "a6000-1"], "kept, as before taints"
        assert taints(env, pool) == []
        assert env.condition("ThunderReachable")["reason"] == "ZonesUnreadable"
        (again,) = env.events("DeviceTaintsUnsupported")
        assert again.get("count", 1) == 1, "reported once"

        env.operator.restart()
        wait_for(lambda: env.passes_done() >= 1, "the restarted operator's first pass")
        env.sync()
        writes = env.operator_writes(mark, ["resourceslices", "deviceclasses"])
        assert writes == [], [(w.get("verb"), w.get("requestURI")) for w in writes]
    finally:
        httpx.delete(f"{env.fake.base_url}/_admin/faults/{fault}").raise_for_status()
    env.sync()
    assert env.devices(pool) == ["a6000-0", "a6000-1"]
