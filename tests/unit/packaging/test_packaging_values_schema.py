"""values.schema.json: misspelled keys fail naming the key, and it agrees with the CRD."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from release import helm_schema
from tests.unit.packaging.chartkit import CHART, REPO, RenderError, render

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
CRD = yaml.safe_load((REPO / "crds" / "thunderclusters.thundercompute.com.yaml").read_text())
CRD_SPEC = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


@pytest.mark.parametrize(
    ("key", "named"),
    [
        ("thunder.secretNmae", "secretNmae"),
        ("operator.reconcielInterval", "reconcielInterval"),
        ("nvidia.minDriverVerison", "minDriverVerison"),
        ("kubelet.pluginDir", "pluginDir"),
        ("daemon.nodeSelecter", "nodeSelecter"),
        ("webhook.certManager.enable", "enable"),
        ("opertor.replicas", "opertor"),
    ],
)
def test_a_misspelled_set_key_fails_naming_it(key: str, named: str) -> None:
    with pytest.raises(RenderError) as caught:
        render("--set", f"{key}=1")
    message = str(caught.value)
    assert "schema" in message
    assert named in message


def test_every_closed_object_of_every_chart_rejects_a_misspelling() -> None:
    for chart in helm_schema.CHARTS:
        assert helm_schema.check_chart(chart) == [], chart.name


def test_schema_is_self_contained_and_closed_everywhere() -> None:
    assert helm_schema.remote_refs(SCHEMA) == []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                assert node.get("additionalProperties") is False, path
            for key, value in node.items():
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")

    walk(SCHEMA, "$")


def _crd_default(*path: str) -> Any:
    node = CRD_SPEC
    for part in path:
        node = node["properties"][part]
    return node.get("default")


@pytest.mark.parametrize(
    "path",
    [
        ("thunder", "secretName"),
        ("thunder", "apiURL"),
        ("thunder", "artifactBaseURL"),
        ("thunder", "telemetryURL"),
        ("operator", "extendedResourcePrefix"),
        ("operator", "deviceClassPrefix"),
        ("operator", "reconcileInterval"),
        ("operator", "orphanGracePeriod"),
        ("operator", "inventoryConcurrency"),
        ("nvidia", "minDriverVersion"),
        ("kubelet", "pluginDirRoot"),
        ("daemon", "nodeSelector"),
        ("daemon", "tolerations"),
        ("daemon", "resources"),
        ("daemon", "priorityClassName"),
        ("daemon", "advertisedIPLabel"),
        ("daemon", "logLevel"),
    ],
)
def test_value_defaults_are_the_thunderclusters_defaults(path: tuple[str, ...]) -> None:
    value: Any = VALUES
    for part in path:
        value = value[part]
    default = _crd_default(*path)
    if path == ("daemon", "resources"):
        node = CRD_SPEC["properties"]["daemon"]["properties"]["resources"]["properties"]
        default = {k: node[k]["default"] for k in ("requests", "limits")}
    assert value == default


def test_seed_defaults() -> None:
    assert VALUES["thunder"]["secretName"] == "thunder-api"
    assert VALUES["operator"]["extendedResourcePrefix"] == "thundercompute.com/gpu-"
    assert VALUES["operator"]["reconcileInterval"] == "60s"
    assert VALUES["operator"]["orphanGracePeriod"] == "5m"
    assert VALUES["nvidia"]["minDriverVersion"] == 610
    assert VALUES["kubelet"]["pluginDirRoot"] == "/var/lib/kubelet/plugins"
    for image in (VALUES["operator"]["image"], VALUES["daemon"]["image"]):
        assert image["tag"], "the chart records its image tags"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("thunder.apiURL", "http://example.com"),
        ("operator.extendedResourcePrefix", "kubernetes.io/gpu-"),
        ("operator.extendedResourcePrefix", "no-domain"),
        ("operator.reconcileInterval", "sixty"),
        ("nvidia.minDriverVersion", "200"),
        ("daemon.image.pullPolicy", "Sometimes"),
        ("webhook.failurePolicy", "Maybe"),
    ],
)
def test_bad_values_are_refused(key: str, value: str) -> None:
    with pytest.raises(RenderError):
        render("--set", f"{key}={value}")


def test_loopback_http_is_allowed_for_a_local_thunder() -> None:
    spec = render("--set", "thunder.apiURL=http://127.0.0.1:8443").one("ThunderCluster")["spec"]
    assert spec["thunder"]["apiURL"] == "http://127.0.0.1:8443"
