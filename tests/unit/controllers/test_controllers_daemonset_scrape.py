"""The daemon pods carry Prometheus's scrape annotations, pointing at the port and path
where the daemon serves /metrics."""

from __future__ import annotations

from typing import Any

from thunder_dra.api.thundercluster import ThunderClusterSpec
from thunder_dra.controllers.shared.ownership import ThunderClusterRef
from thunder_dra.controllers.workload.daemonset import HEALTH_PORT, render
from thunder_dra.process.health import METRICS

OWNER = ThunderClusterRef("main", "uid-1")


def pod_template(**spec: Any) -> dict[str, Any]:
    body = render(
        ThunderClusterSpec.model_validate(spec), "thunder-system", OWNER, "thunder-dra-daemon"
    )
    template: dict[str, Any] = body["spec"]["template"]
    return template


def test_daemon_pods_carry_the_scrape_annotations() -> None:
    template = pod_template()
    assert template["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(HEALTH_PORT),
        "prometheus.io/path": METRICS,
    }
    container = template["spec"]["containers"][0]
    # The annotated port is a declared container port (the one PodMonitors name) and the
    # port the daemon's command line serves /metrics on.
    assert {"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"} in container["ports"]
    command = container["command"]
    assert command[command.index("--health-port") + 1] == str(HEALTH_PORT)


def test_pod_annotations_of_the_spec_are_added_and_win() -> None:
    template = pod_template(
        daemon={"podAnnotations": {"prometheus.io/scrape": "false", "team": "gpu"}}
    )
    assert template["metadata"]["annotations"] == {
        "prometheus.io/scrape": "false",
        "prometheus.io/port": str(HEALTH_PORT),
        "prometheus.io/path": METRICS,
        "team": "gpu",
    }
