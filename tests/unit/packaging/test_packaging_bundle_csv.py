"""The OLM bundle's ClusterServiceVersion: what OLM and OperatorHub need from it."""

from __future__ import annotations

import base64
import json
from typing import Any

import yaml

from tests.unit.packaging.chartkit import REPO

MANIFESTS = REPO / "bundle" / "manifests"
CSV: dict[str, Any] = yaml.safe_load(
    (MANIFESTS / "thunder-device-plugin.clusterserviceversion.yaml").read_text()
)


def test_identity_and_catalog_metadata() -> None:
    spec = CSV["spec"]
    assert CSV["metadata"]["name"] == f"thunder-device-plugin.v{spec['version']}"
    assert spec["minKubeVersion"] == "1.34.0"
    assert spec["maturity"] == "alpha"
    assert spec["provider"]["name"]
    for field in ("maintainers", "links", "keywords"):
        assert spec[field], field
    icon = spec["icon"][0]
    assert icon["mediatype"] == "image/svg+xml"
    assert base64.b64decode(icon["base64data"]).startswith(b"<svg")
    modes = {m["type"]: m["supported"] for m in spec["installModes"]}
    assert modes == {
        "OwnNamespace": False,
        "SingleNamespace": False,
        "MultiNamespace": False,
        "AllNamespaces": True,
    }


def test_owned_crds_with_descriptors_and_examples() -> None:
    owned = {c["kind"]: c for c in CSV["spec"]["customresourcedefinitions"]["owned"]}
    assert {"ThunderCluster", "Client"} <= set(owned)
    tc = owned["ThunderCluster"]
    paths = {d["path"] for d in tc["specDescriptors"]}
    assert {"thunder.secretName", "operator.reconcileInterval", "nvidia.minDriverVersion"} <= paths
    status = {d["path"]: d for d in tc["statusDescriptors"]}
    assert status["conditions"]["x-descriptors"] == ["urn:alm:descriptor:io.kubernetes.conditions"]
    assert {d["path"] for d in owned["Client"]["statusDescriptors"]} >= {"phase", "clientId"}
    examples = json.loads(CSV["metadata"]["annotations"]["alm-examples"])
    assert {e["kind"] for e in examples} >= {"ThunderCluster", "Client"}
    internal = json.loads(
        CSV["metadata"]["annotations"]["operators.operatorframework.io/internal-objects"]
    )
    assert "clients.thundercompute.com" in internal


def test_install_strategy_permissions_and_webhooks() -> None:
    install = CSV["spec"]["install"]
    assert install["strategy"] == "deployment"
    deployment = install["spec"]["deployments"][0]
    assert deployment["name"] == "thunder-operator"
    cluster = {p["serviceAccountName"]: p["rules"] for p in install["spec"]["clusterPermissions"]}
    assert set(cluster) == {"thunder-operator", "thunder-daemon"}
    writes = {"create", "update", "patch", "delete"}
    for rule in cluster["thunder-daemon"]:
        if {"resourceslices", "deviceclasses"} & set(rule["resources"]):
            assert not writes & set(rule["verbs"])
    namespaced = {p["serviceAccountName"] for p in install["spec"]["permissions"]}
    assert namespaced == {"thunder-operator"}
    hooks = {w["generateName"]: w for w in CSV["spec"]["webhookdefinitions"]}
    assert set(hooks) == {"thunderclusters.thundercompute.com", "clients.thundercompute.com"}
    ports = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
    webhook_port = next(p["containerPort"] for p in ports if p["name"] == "webhook")
    for hook in hooks.values():
        assert hook["type"] == "ValidatingAdmissionWebhook"
        assert hook["deploymentName"] == "thunder-operator"
        assert hook["targetPort"] == webhook_port
    # OLM mounts its certificate where the operator reads it.
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["THUNDER_WEBHOOK_CERT_DIR"] == "/tmp/k8s-webhook-server/serving-certs"


def test_bundle_metadata_and_dockerfile_agree() -> None:
    annotations = yaml.safe_load((REPO / "bundle" / "metadata" / "annotations.yaml").read_text())
    labels = annotations["annotations"]
    assert labels["operators.operatorframework.io.bundle.package.v1"] == "thunder-device-plugin"
    dockerfile = (REPO / "bundle" / "bundle.Dockerfile").read_text()
    for key, value in labels.items():
        assert f"LABEL {key}={value}" in dockerfile
    assert "COPY manifests /manifests/" in dockerfile
