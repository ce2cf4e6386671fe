"""Generated and copied files stay in step with their sources."""

from __future__ import annotations

import filecmp
from typing import Any

from release import bundle, helm_docs
from tests.unit.packaging.chartkit import CHART, REPO, Manifests, kustomize, render

CRDS = sorted((REPO / "crds").glob("*.yaml"))


def test_crd_copies_are_byte_identical_to_crds() -> None:
    assert CRDS, "crds/ holds the generated CRDs"
    for folder in (
        CHART / "crds",
        REPO / "config" / "crd" / "bases",
        REPO / "bundle" / "manifests",
    ):
        for source in CRDS:
            copy = folder / source.name
            assert copy.exists(), f"{copy} missing: run make sync-crds"
            assert filecmp.cmp(source, copy, shallow=False), f"{copy} differs: run make sync-crds"
    # kopf's peering CRD is gone: leader election uses a Lease.
    assert not list(CHART.glob("crds/*kopf.dev*"))
    assert not list((REPO / "config").rglob("*kopf.dev*"))


def test_chart_readme_is_generated_from_values_and_schema() -> None:
    assert helm_docs.main(["--check"]) == 0, "run make helm-docs"
    readme = (CHART / "README.md").read_text()
    for key in ("thunder.secretName", "operator.reconcileInterval", "kubelet.pluginDirRoot"):
        assert f"`{key}`" in readme


def test_bundle_is_generated_from_config() -> None:
    assert bundle.main(["--check"]) == 0, "run make bundle"


def _rules(m: Manifests, kind: str, name: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = m.one(kind, name)["rules"]
    return rules


def test_chart_rbac_is_config_rbac() -> None:
    chart = render(release="thunder-device-plugin")
    config = kustomize(REPO / "config" / "default")
    pairs = [
        ("ClusterRole", "thunder-device-plugin-operator", "thunder-operator"),
        ("ClusterRole", "thunder-device-plugin-daemon", "thunder-daemon"),
        ("Role", "thunder-device-plugin-operator", "thunder-operator"),
    ]
    for kind, chart_name, config_name in pairs:
        assert _rules(chart, kind, chart_name) == _rules(config, kind, config_name), chart_name


def test_chart_and_config_run_the_operator_the_same_way() -> None:
    chart = render(release="thunder-device-plugin").one("Deployment")["spec"]["template"]
    config = kustomize(REPO / "config" / "default").one("Deployment")["spec"]["template"]
    a, b = chart["spec"]["containers"][0], config["spec"]["containers"][0]
    for field in ("ports", "startupProbe", "livenessProbe", "readinessProbe", "securityContext"):
        assert a[field] == b[field], field
    assert chart["spec"]["securityContext"] == config["spec"]["securityContext"]
    names_a = {e["name"] for e in a["env"]}
    names_b = {e["name"] for e in b["env"]}
    assert names_a == names_b


def test_config_default_renders_a_complete_install() -> None:
    m = kustomize(REPO / "config" / "default")
    assert {
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "Role",
        "Deployment",
        "Service",
        "ValidatingWebhookConfiguration",
        "Certificate",
        "Issuer",
    } <= m.kinds()
    assert {o["metadata"].get("namespace") for o in m.objects} <= {None, "thunder-system"}
    hook = m.one("ValidatingWebhookConfiguration")
    for w in hook["webhooks"]:
        assert w["clientConfig"]["service"]["namespace"] == "thunder-system"
    samples = kustomize(REPO / "config" / "samples")
    assert samples.one("ThunderCluster")["metadata"]["name"] == "thunder"
