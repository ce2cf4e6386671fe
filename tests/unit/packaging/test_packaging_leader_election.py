"""The chart's leader election: the Lease the operator is told to use is the one its Role
names, the timings reach the process and are refused out of order, no kopf peering."""

from __future__ import annotations

import pytest

from tests.unit.packaging.chartkit import REPO, RenderError, env_of, kustomize, render
from thunder_dra.controllers.process.options import ElectionTimings, parse_options

pytestmark = pytest.mark.unit


def _operator_env(*args: str) -> dict[str, str]:
    deployment = render(*args).one("Deployment", "tdp-thunder-device-plugin-operator")
    return env_of(deployment["spec"]["template"]["spec"]["containers"][0])


def _lease_rules(rules: list[dict[str, object]]) -> list[dict[str, object]]:
    return [r for r in rules if r.get("apiGroups") == ["coordination.k8s.io"]]


def test_the_operator_elects_through_the_lease_its_role_grants() -> None:
    manifests = render()
    env = _operator_env()
    lease = env["THUNDER_LEADER_ELECTION_LEASE"]
    assert lease == "tdp-thunder-device-plugin"
    rules = _lease_rules(manifests.one("Role")["rules"])
    assert rules == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [lease],
            "verbs": ["get", "update"],
        },
    ]
    # Namespaced only, and no kopf.dev rights or peering left anywhere.
    for role in manifests.of_kind("ClusterRole"):
        assert not _lease_rules(role["rules"])
        assert all("kopf.dev" not in r["apiGroups"] for r in role["rules"])
    assert not any(name.startswith("THUNDER_PEERING") for name in env)
    assert "CustomResourceDefinition" not in manifests.kinds()


def test_the_chart_timings_reach_the_process_as_its_flags_read_them() -> None:
    env = _operator_env()
    timings = parse_options([], environ=env).election
    assert timings == ElectionTimings(15, 10, 2)
    env = _operator_env(
        "--set",
        "operator.leaderElection.leaseDurationSeconds=30",
        "--set",
        "operator.leaderElection.renewDeadlineSeconds=20",
        "--set",
        "operator.leaderElection.retryPeriodSeconds=5",
    )
    assert parse_options([], environ=env).election == ElectionTimings(30, 20, 5)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"leaseDurationSeconds": 10, "renewDeadlineSeconds": 10}, "renewDeadlineSeconds"),
        ({"renewDeadlineSeconds": 2, "retryPeriodSeconds": 2}, "retryPeriodSeconds"),
        ({"retryPeriodSeconds": 0}, "retryPeriodSeconds"),
        ({"leaseDurationSeconds": "15s"}, "leaseDurationSeconds"),
    ],
)
def test_timings_out_of_order_or_range_are_refused_naming_the_value(
    values: dict[str, object], named: str
) -> None:
    args = []
    for key, value in values.items():
        flag = "--set-string" if isinstance(value, str) else "--set"
        args += [flag, f"operator.leaderElection.{key}={value}"]
    with pytest.raises(RenderError, match=named):
        render(*args)


def test_config_matches_the_chart() -> None:
    config = kustomize(REPO / "config" / "default")
    deployment = config.one("Deployment")
    env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
    lease = env["THUNDER_LEADER_ELECTION_LEASE"]
    assert parse_options([], environ=env).election == ElectionTimings(15, 10, 2)
    (role,) = [r for r in config.of_kind("Role") if _lease_rules(r["rules"])]
    assert _lease_rules(role["rules"])[1]["resourceNames"] == [lease]
    assert role["metadata"]["namespace"] == deployment["metadata"]["namespace"]
