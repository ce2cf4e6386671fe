"""The shipped alert rules and the daemon's scrape objects.

The rules (charts/thunder-device-plugin/files/alerts.yaml) pass `promtool check rules`
and `promtool test rules` on tests/promtool/alerts_test.yaml, where every alert has a case
that fires and one that stays silent. promtool comes from hack/ensure-promtool.sh
(`make test` runs it); a missing promtool fails these tests. The chart carries the rules
in an opt-in PrometheusRule, and the daemon pods' PodMonitor (chart and config/) selects
exactly the labels the operator gives the daemon pods.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.support.promtool import promtool
from tests.unit.packaging.chartkit import CHART, NAMESPACE, REPO, kustomize, render
from thunder_dra.controllers.workload.daemonset import SCRAPE_ANNOTATIONS, selector_labels

RULES = CHART / "files" / "alerts.yaml"
RULE_TESTS = REPO / "tests" / "promtool" / "alerts_test.yaml"
CONFIG_POD_MONITOR = REPO / "config" / "prometheus" / "monitors" / "daemon_monitor.yaml"
RUNBOOKS = REPO / "docs" / "observability.md"
RUNBOOK_BASE = (
    "https://github.com/thunder-compute/thunder-device-plugin/blob/main/docs/observability.md#"
)


def run_promtool(*args: str) -> None:
    done = subprocess.run(
        [promtool(), *args], cwd=REPO, check=False, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_rules_pass_promtool_check() -> None:
    run_promtool("check", "rules", str(RULES))


def test_rules_pass_their_promtool_unit_tests() -> None:
    run_promtool("test", "rules", str(RULE_TESTS.relative_to(REPO)))


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    cases = yaml.safe_load(RULE_TESTS.read_text())
    assert cases["rule_files"] == ["../../charts/thunder-device-plugin/files/alerts.yaml"]
    fires: set[str] = set()
    silent: set[str] = set()
    for test in cases["tests"]:
        for case in test.get("alert_rule_test", []):
            (fires if case["exp_alerts"] else silent).add(case["alertname"])
    names = {rule["alert"] for rule in alerts()}
    assert len(names) == len(alerts())
    assert names == fires
    assert names == silent


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_has_a_runbook_section() -> None:
    anchors = {
        _anchor(line.lstrip("#"))
        for line in RUNBOOKS.read_text().splitlines()
        if line.startswith("#")
    }
    for rule in alerts():
        annotations = rule["annotations"]
        assert annotations["summary"]
        assert annotations["description"]
        assert rule["labels"]["severity"] in ("warning", "critical")
        url = annotations["runbook_url"]
        assert url.startswith(RUNBOOK_BASE), url
        assert url.removeprefix(RUNBOOK_BASE) in anchors, f"{rule['alert']}: no section {url}"


def test_prometheus_rule_is_opt_in_and_carries_the_rules_file() -> None:
    assert not render().of_kind("PrometheusRule")
    m = render(
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.prometheusRule.labels.release=kube-prometheus-stack",
    )
    rule = m.one("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == NAMESPACE
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


def test_daemon_pod_monitor_is_opt_in_and_selects_the_daemon_pods() -> None:
    assert not render().of_kind("PodMonitor")
    m = render(
        "--set",
        "metrics.podMonitor.enabled=true",
        "--set",
        "metrics.podMonitor.interval=15s",
        "--set",
        "metrics.podMonitor.labels.release=kube-prometheus-stack",
    )
    monitor = m.one("PodMonitor")
    assert monitor["metadata"]["namespace"] == NAMESPACE
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    spec = monitor["spec"]
    # The operator renders the daemon DaemonSet in its own namespace, the release's.
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert spec["selector"] == {"matchLabels": selector_labels()}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint["port"] == "health"
    assert endpoint["path"] == SCRAPE_ANNOTATIONS["prometheus.io/path"]
    assert endpoint["interval"] == "15s"
    # The operator's own pods are not selected.
    operator_labels = m.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not spec["selector"]["matchLabels"].items() <= operator_labels.items()


def test_config_daemon_pod_monitor_selects_the_daemon_pods() -> None:
    monitor = yaml.safe_load(CONFIG_POD_MONITOR.read_text())
    assert monitor["kind"] == "PodMonitor"
    assert monitor["spec"]["selector"] == {"matchLabels": selector_labels()}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("health", "/metrics")
    # Optional, like the operator's ServiceMonitor: no install of config/ requires the CRD.
    for overlay in ("default", "manifests"):
        assert not kustomize(REPO / "config" / overlay).of_kind("PodMonitor")


def test_chart_and_config_monitors_scrape_alike() -> None:
    chart = render("--set", "metrics.podMonitor.enabled=true").one("PodMonitor")["spec"]
    config = yaml.safe_load(CONFIG_POD_MONITOR.read_text())
    chart_endpoint = chart["podMetricsEndpoints"][0]
    config_endpoint = config["spec"]["podMetricsEndpoints"][0]
    for key in ("port", "path", "relabelings"):
        assert chart_endpoint[key] == config_endpoint[key], key
    assert chart["selector"] == config["spec"]["selector"]


def test_rules_file_is_in_the_packaged_chart() -> None:
    ignored = (CHART / ".helmignore").read_text().splitlines()
    assert not any(Path("files/alerts.yaml").match(p) for p in ignored if p and p[0] != "#")
