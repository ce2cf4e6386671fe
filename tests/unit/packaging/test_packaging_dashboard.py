"""The shipped Grafana dashboard and its opt-in ConfigMap.

The dashboard (charts/thunder-device-plugin/files/dashboard.json) picks its Prometheus
through a `datasource` variable, every panel queries something, every query names only
metric families the operator or the daemon registers (read from their own registries),
and every query parses as PromQL (`promtool check rules` on the queries written as
recording rules; promtool comes from hack/ensure-promtool.sh, which `make test` runs).
The chart carries the file, byte for byte, in a ConfigMap for Grafana's dashboard
sidecar only when metrics.dashboard.enabled is set.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from tests.support.dashboard import DASHBOARD, dashboard, panel_queries, panels, substitute
from tests.support.promtool import promtool
from tests.unit.packaging.chartkit import CHART, NAMESPACE, render
from thunder_dra.controllers.process.main import Operator
from thunder_dra.controllers.process.options import parse_options
from thunder_dra.plugin.kubelet.handler import DEFAULT_CLAIM_CONCURRENCY, ClaimSlots
from thunder_dra.plugin.metrics import DaemonMetrics
from thunder_dra.thunder import metrics_for

CONFIGMAP = "tdp-thunder-device-plugin-dashboard"
DATA_KEY = "thunder-device-plugin.json"

# Each family type's sample names, as the Prometheus client exposes them.
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
}


def _exposed(registry: CollectorRegistry) -> set[str]:
    return {
        family.name + suffix
        for family in registry.collect()
        for suffix in _SUFFIXES.get(family.type, ("",))
    }


def operator_registry() -> CollectorRegistry:
    """What the operator serves on /metrics: the registry its process builds, with the
    Thunder client's families its first client registers there."""
    operator = Operator(parse_options([], environ={}))
    metrics_for(operator.registry)
    return operator.registry


def daemon_registry() -> CollectorRegistry:
    """What the daemon serves: its families, the Thunder client's, and the claim slots'."""
    metrics = DaemonMetrics(CollectorRegistry())
    ClaimSlots(DEFAULT_CLAIM_CONCURRENCY, metrics.registry)
    return metrics.registry


def served_names() -> set[str]:
    return _exposed(operator_registry()) | _exposed(daemon_registry())


_STRINGS = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'")
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"(?<![\w.:])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, aggregations, keywords,
    label names and values left out)."""
    bare = _STRINGS.sub('""', expr)
    for pattern in (_MATCHERS, _RANGES, _LABEL_LISTS):
        bare = pattern.sub(" ", bare)
    return {
        match.group(1)
        for match in _NAME.finditer(bare)
        if match.group(2) is None and match.group(1).lower() not in _KEYWORDS
    }


def test_metric_names_are_read_from_an_expression() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, node) (rate(a_seconds_bucket{x="b c", d!~"2.."}'
        "[$__rate_interval]))) / on (instance) group_left (pod) b_total offset 1h "
        'and ignoring (state) c == bool 1e3 unless d{e="f(g)"}'
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "c", "d"}


def test_the_dashboard_is_identified_and_picks_its_prometheus() -> None:
    board = dashboard()
    assert board["uid"] == "thunder-device-plugin"
    assert board["title"]
    assert isinstance(board["schemaVersion"], int)
    assert board["schemaVersion"] >= 39
    (variable,) = [v for v in board["templating"]["list"] if v["name"] == "datasource"]
    assert (variable["type"], variable["query"]) == ("datasource", "prometheus")
    for panel in panels(board):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]


def test_every_panel_queries_something() -> None:
    board = dashboard()
    shown = list(panels(board))
    assert len(shown) >= 10
    for panel in shown:
        assert panel["title"]
        exprs = [t.get("expr", "") for t in panel.get("targets", [])]
        assert exprs, panel["title"]
        assert all(e.strip() for e in exprs), panel["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    titles = [p["title"] for p in shown]
    assert len(titles) == len(set(titles))


def _cells(panel: dict[str, Any]) -> set[tuple[int, int]]:
    grid = panel["gridPos"]
    return {(grid["x"] + dx, grid["y"] + dy) for dx in range(grid["w"]) for dy in range(grid["h"])}


def test_panels_do_not_overlap() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in dashboard()["panels"]:
        cells = _cells(panel)
        assert all(0 <= x < 24 for x, _ in cells), panel["title"]
        assert not cells & taken, panel["title"]
        taken |= cells


def test_every_query_names_only_metrics_the_processes_serve() -> None:
    served = served_names()
    assert "thunder_dra_operator_leader" in served
    assert "thunder_dra_daemon_claims_in_flight" in served
    used: set[str] = set()
    for title, expr in panel_queries():
        names = metric_names(expr)
        assert names, f"{title}: {expr}"
        assert names <= served, f"{title}: {sorted(names - served)} not served"
        used |= names
    # The families the issue asks a view of.
    for family in (
        "thunder_dra_operator_pool_published_devices",
        "thunder_dra_daemon_prepared_claims",
        "thunder_dra_operator_thunder_reachable",
        "thunder_dra_thunder_api_requests_total",
        "thunder_dra_thunder_api_request_duration_seconds_bucket",
        "thunder_dra_daemon_prepare_duration_seconds_bucket",
        "thunder_dra_daemon_errors_total",
        "thunder_dra_operator_leader",
        "thunder_dra_operator_inventory_passes_total",
    ):
        assert family in used, family


def test_per_node_queries_also_keep_the_instance() -> None:
    """`node` comes from a relabeling (the PodMonitor's, or the user's annotation job);
    `instance` is there however the daemons are scraped, so a per-node series stays
    apart without the relabeling too."""
    per_node = [
        (title, expr) for title, expr in panel_queries() if re.search(r"by \([^)]*\bnode\b", expr)
    ]
    assert per_node
    for title, expr in per_node:
        for labels in re.findall(r"by \(([^)]*)\)", expr):
            names = {n.strip() for n in labels.split(",")}
            if "node" in names:
                assert "instance" in names, f"{title}: {expr}"


def test_every_query_parses_as_promql(tmp_path: Path) -> None:
    rules = [
        {"record": f"thunder_dra_dashboard:query_{i}", "expr": expr}
        for i, (_, expr) in enumerate(panel_queries())
    ]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(
        [promtool(), "check", "rules", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(rules)} rules found" in done.stdout


def test_panel_queries_are_plain_promql() -> None:
    queries = panel_queries("2m")
    assert len(queries) == sum(len(p["targets"]) for p in panels())
    assert all("$" not in expr for _, expr in queries)
    assert any("[2m]" in expr for _, expr in queries)
    assert substitute("rate(x[${__rate_interval}]) + rate(y[$__interval])", "1m") == (
        "rate(x[1m]) + rate(y[1m])"
    )
    with pytest.raises(ValueError, match=r"\$node"):
        substitute('x{node="$node"}')


def test_the_configmap_is_opt_in() -> None:
    assert not [c for c in render().of_kind("ConfigMap") if c["metadata"]["name"] == CONFIGMAP]


def test_the_configmap_carries_the_dashboard_for_the_sidecar() -> None:
    configmap = render("--set", "metrics.dashboard.enabled=true").one("ConfigMap", CONFIGMAP)
    metadata = configmap["metadata"]
    assert metadata["namespace"] == NAMESPACE
    assert metadata["labels"]["grafana_dashboard"] == "1"
    assert metadata["labels"]["app.kubernetes.io/part-of"] == "thunder-device-plugin"
    assert "annotations" not in metadata
    assert configmap["data"] == {DATA_KEY: DASHBOARD.read_text()}


def test_the_sidecar_label_folder_and_namespace_are_values() -> None:
    configmap = render(
        "--set",
        "metrics.dashboard.enabled=true",
        "--set",
        "metrics.dashboard.label=dashboards.example.com/grafana",
        "--set",
        "metrics.dashboard.labelValue=yes",
        "--set",
        "metrics.dashboard.folder=Thunder Compute",
        "--set",
        "metrics.dashboard.folderAnnotation=grafana_dashboard_folder",
        "--set",
        "metrics.dashboard.namespace=monitoring",
        "--set",
        "metrics.dashboard.labels.team=gpu",
    ).one("ConfigMap", CONFIGMAP)
    metadata = configmap["metadata"]
    assert metadata["namespace"] == "monitoring"
    assert metadata["labels"]["dashboards.example.com/grafana"] == "yes"
    assert "grafana_dashboard" not in metadata["labels"]
    assert metadata["labels"]["team"] == "gpu"
    assert metadata["annotations"] == {"grafana_dashboard_folder": "Thunder Compute"}
    assert configmap["data"][DATA_KEY] == DASHBOARD.read_text()


def test_the_folder_goes_in_the_sidecars_default_annotation() -> None:
    configmap = render(
        "--set", "metrics.dashboard.enabled=true", "--set", "metrics.dashboard.folder=GPUs"
    ).one("ConfigMap", CONFIGMAP)
    assert configmap["metadata"]["annotations"] == {"k8s-sidecar-target-directory": "GPUs"}


def test_the_dashboard_file_is_in_the_packaged_chart() -> None:
    ignored = (CHART / ".helmignore").read_text().splitlines()
    assert not any(Path("files/dashboard.json").match(p) for p in ignored if p and p[0] != "#")
