"""On an API server without DRAExtendedResource (1.34 emulated, gate off), the operator
sees `extendedResourceName` dropped, says so, and publishes classes without it: no
churn, and no write after a restart either."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hack.fake_thunder import FakeThunderProcess
from hack.testbed.kube import wait_for
from hack.testbed.operator import OperatorEnv, operator_env_on_emulated


@pytest.fixture(scope="module")
def env(
    fake_thunder: FakeThunderProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorEnv]:
    workdir = tmp_path_factory.mktemp("old")
    gates = {"DRAExtendedResource": False}
    with operator_env_on_emulated("1.34", fake_thunder, workdir, gates=gates) as made:
        yield made


def test_a_dropped_extended_resource_name_is_detected_and_not_fought(env: OperatorEnv) -> None:
    env.add_zone(env.zone("old"), [("A6000", 2)])
    env.sync()

    def class_without_field() -> bool:
        found = env.device_class("thunder-gpu-a6000")
        return found is not None and "extendedResourceName" not in found["spec"]

    wait_for(class_without_field, "the class, stored without extendedResourceName")
    env.sync()
    assert env.events("ExtendedResourceUnsupported")
    assert env.operator.metric("thunder_dra_operator_extended_resource_supported") == 0
    assert env.condition("InventorySynced")["status"] == "True"

    mark = len(env.cluster.audit_events())
    env.sync()
    assert env.operator_writes(mark, ["deviceclasses", "resourceslices"]) == []

    env.operator.restart()
    wait_for(lambda: env.passes_done() >= 1, "the restarted operator's first pass")
    env.sync()
    writes = env.operator_writes(mark, ["deviceclasses", "resourceslices"])
    assert writes == [], [(w.get("verb"), w.get("requestURI")) for w in writes]
    assert env.operator.metric("thunder_dra_operator_extended_resource_supported") == 0
