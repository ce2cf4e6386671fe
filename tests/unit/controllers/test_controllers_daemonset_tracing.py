"""Tracing configured for the operator reaches the daemon pods: the DaemonSet the
operator's loop writes carries the operator's OTEL_* settings, under the daemon's own
service name, with OTLP headers only through a Secret reference."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from tests.support.fakekube import FakeKube
from tests.unit.packaging.chartkit import render
from thunder_dra.api.thundercluster import ThunderCluster
from thunder_dra.controllers.process.loop import ClusterLoop
from thunder_dra.controllers.process.main import Operator
from thunder_dra.controllers.process.options import parse_options
from thunder_dra.controllers.workload.daemonset import DAEMONSET_NAME
from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.events import EventRecorder
from thunder_dra.kube.resources import DAEMON_SETS

pytestmark = pytest.mark.unit

NAMESPACE = "thunder-system"
HEADER_VALUE = "Authorization=Bearer collector-credential-5e3a"

# What the chart sets on the operator's Deployment with operator.otel.enabled=true.
OPERATOR_TRACING = {
    "OTEL_SERVICE_NAME": "thunder-operator",
    "OTEL_SDK_DISABLED": "false",
    "OTEL_TRACES_EXPORTER": "otlp",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector.observability:4317",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,k8s.cluster.name=east",
    "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
    "OTEL_TRACES_SAMPLER_ARG": "0.25",
    "OTEL_METRICS_EXPORTER": "none",
    "OTEL_LOGS_EXPORTER": "none",
}


def _cluster(**spec: Any) -> ThunderCluster:
    return ThunderCluster.model_validate(
        {
            "apiVersion": "thundercompute.com/v1alpha1",
            "kind": "ThunderCluster",
            "metadata": {"name": "thunder", "generation": 1, "uid": "tc-uid"},
            "spec": spec,
        }
    )


async def _daemonset_written(
    environ: dict[str, str], argv: list[str] | None = None, **spec: Any
) -> dict[str, Any]:
    """Start an operator with `environ`, run its DaemonSet step against the in-memory
    apiserver; the DaemonSet it stored."""
    operator = Operator(
        parse_options(argv or [], environ={"THUNDER_NAMESPACE": NAMESPACE, **environ})
    )
    kube = KubeClient(FakeKube())
    events = EventRecorder(kube, component="thunder-operator", instance="test", scrub=str)
    services = dataclasses.replace(operator.services, kube=kube, events=events)
    loop = ClusterLoop(services, "tc-uid", "thunder")
    await loop._reconcile_daemonset(_cluster(**spec))
    stored = await kube.get(DAEMON_SETS.item(DAEMONSET_NAME, NAMESPACE))
    await operator.services.kube.close()
    return stored


def _env(daemonset: dict[str, Any]) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = daemonset["spec"]["template"]["spec"]["containers"][0]["env"]
    return env


def _values(daemonset: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in _env(daemonset) if "value" in e}


async def test_the_daemon_pods_get_the_operators_tracing_under_their_own_name() -> None:
    values = _values(await _daemonset_written(OPERATOR_TRACING))
    for name in (
        "OTEL_SDK_DISABLED",
        "OTEL_TRACES_EXPORTER",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_RESOURCE_ATTRIBUTES",
        "OTEL_TRACES_SAMPLER",
        "OTEL_TRACES_SAMPLER_ARG",
    ):
        assert values.get(name) == OPERATOR_TRACING[name], name
    assert values["OTEL_SERVICE_NAME"] == "thunder-dra-daemon"


async def test_tracing_switched_off_for_the_operator_is_off_for_the_daemon() -> None:
    values = _values(
        await _daemonset_written({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "none"})
    )
    assert values["OTEL_SDK_DISABLED"] == "true"
    assert values["OTEL_TRACES_EXPORTER"] == "none"
    assert values["OTEL_SERVICE_NAME"] == "thunder-dra-daemon"


async def test_otlp_headers_reach_the_daemon_only_through_the_named_secret() -> None:
    environ = {**OPERATOR_TRACING, "OTEL_EXPORTER_OTLP_HEADERS": HEADER_VALUE}
    without_secret = await _daemonset_written(environ)
    assert HEADER_VALUE not in json.dumps(without_secret)
    assert "OTEL_EXPORTER_OTLP_HEADERS" not in {e["name"] for e in _env(without_secret)}

    with_secret = await _daemonset_written(
        {**environ, "THUNDER_OTEL_HEADERS_SECRET": "otel-auth"},
        ["--otel-headers-secret-key", "otlp-headers"],
    )
    assert HEADER_VALUE not in json.dumps(with_secret)
    (headers,) = [e for e in _env(with_secret) if e["name"] == "OTEL_EXPORTER_OTLP_HEADERS"]
    assert headers == {
        "name": "OTEL_EXPORTER_OTLP_HEADERS",
        "valueFrom": {"secretKeyRef": {"name": "otel-auth", "key": "otlp-headers"}},
    }


async def test_file_paths_of_the_operators_container_are_not_handed_on() -> None:
    environ = {**OPERATOR_TRACING, "OTEL_EXPORTER_OTLP_CERTIFICATE": "/etc/otel/ca.crt"}
    names = {e["name"] for e in _env(await _daemonset_written(environ))}
    assert "OTEL_EXPORTER_OTLP_CERTIFICATE" not in names


async def test_a_daemon_extra_env_setting_wins_without_a_duplicate_name() -> None:
    daemonset = await _daemonset_written(
        OPERATOR_TRACING,
        daemon={
            "extraEnv": [
                {"name": "OTEL_TRACES_SAMPLER_ARG", "value": "1.0"},
                {"name": "OTEL_SERVICE_NAME", "value": "gpu-node-daemon"},
            ]
        },
    )
    names = [e["name"] for e in _env(daemonset)]
    assert len(names) == len(set(names))
    values = _values(daemonset)
    assert values["OTEL_TRACES_SAMPLER_ARG"] == "1.0"
    assert values["OTEL_SERVICE_NAME"] == "gpu-node-daemon"
    assert values["OTEL_EXPORTER_OTLP_ENDPOINT"] == OPERATOR_TRACING["OTEL_EXPORTER_OTLP_ENDPOINT"]


async def test_a_change_of_the_operators_tracing_rolls_the_daemonset() -> None:
    before = await _daemonset_written(OPERATOR_TRACING)
    after = await _daemonset_written({**OPERATOR_TRACING, "OTEL_TRACES_SAMPLER_ARG": "0.5"})
    annotation = "thundercompute.com/rendered-hash"
    assert (
        before["metadata"]["annotations"][annotation]
        != (after["metadata"]["annotations"][annotation])
    )


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--otel-headers-secret", "Not_A_Name"], "--otel-headers-secret must"),
        (["--otel-headers-secret", "ok", "--otel-headers-secret-key", "a/b"], "-key must"),
    ],
)
def test_a_bad_headers_secret_is_refused_naming_the_flag(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_options(argv, environ={})
    assert named in capsys.readouterr().err


async def test_the_charts_tracing_values_reach_the_daemon_pods() -> None:
    chart = render(
        "--set",
        "operator.otel.enabled=true",
        "--set",
        "operator.otel.endpoint=http://collector.observability:4317",
        "--set",
        "operator.otel.resourceAttributes=deployment.environment=prod",
        "--set",
        "operator.otel.headersSecret.name=otel-auth",
    )
    container = chart.one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    operator_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    headers = [e for e in container["env"] if e["name"] == "OTEL_EXPORTER_OTLP_HEADERS"]
    assert headers == [
        {
            "name": "OTEL_EXPORTER_OTLP_HEADERS",
            "valueFrom": {"secretKeyRef": {"name": "otel-auth", "key": "headers"}},
        }
    ]
    # The operator process sees the Secret's value; give it one to prove it is not copied.
    daemonset = await _daemonset_written(
        {**operator_env, "OTEL_EXPORTER_OTLP_HEADERS": HEADER_VALUE}
    )
    values = _values(daemonset)
    assert values["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector.observability:4317"
    assert values["OTEL_RESOURCE_ATTRIBUTES"] == "deployment.environment=prod"
    assert values["OTEL_SDK_DISABLED"] == "false"
    assert values["OTEL_SERVICE_NAME"] == "thunder-dra-daemon"
    assert [e for e in _env(daemonset) if e["name"] == "OTEL_EXPORTER_OTLP_HEADERS"] == headers
    assert HEADER_VALUE not in json.dumps(daemonset)


def test_the_chart_refuses_a_headers_secret_that_is_not_a_name() -> None:
    with pytest.raises(AssertionError, match="headersSecret"):
        render("--set", "operator.otel.headersSecret.name=Bearer xyz")
