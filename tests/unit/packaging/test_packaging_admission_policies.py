"""The driver's admission policies: one definition, the same rules in every install path."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from release import bundle
from tests.unit.packaging.chartkit import REPO, Manifests, kustomize, render
from thunder_dra.controllers.process.policies import operator_identity, rendered
from thunder_dra.kube import admissionpolicy

KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def _policies(m: Manifests) -> list[dict[str, Any]]:
    return [o for o in m.objects if o["kind"] in KINDS]


def _normalised(objects: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    """Specs by name suffix, with the install's identity strings as placeholders."""
    out = {}
    for obj in objects:
        name = obj["metadata"]["name"]
        assert name.startswith(prefix + "-"), name
        spec = copy.deepcopy(obj["spec"])
        if "policyName" in spec:
            assert spec["policyName"] == name
            spec["policyName"] = "@"
        for var in spec.get("variables", []):
            if var["name"] == "driverNamespace":
                var["expression"] = "@"
            if var["name"] in ("daemonUser", "operatorUser"):
                var["expression"] = var["expression"].rsplit(":", 1)[0]
        for check in spec.get("validations", []):
            check["message"] = "@" if "ServiceAccounts" in check["message"] else check["message"]
        out[f"{obj['kind']}/{name[len(prefix) + 1 :]}"] = spec
    return out


def test_the_generated_chart_template_and_config_files_are_current() -> None:
    assert admissionpolicy.drifted() == [], "run python -m thunder_dra.kube.admissionpolicy"


def test_the_chart_binds_the_policies_to_its_own_service_accounts() -> None:
    m = render(release="tdp", namespace="gpu-system")
    found = _policies(m)
    assert len(found) == 2 * len(admissionpolicy.SUFFIXES)
    for policy in (o for o in found if o["kind"] == KINDS[0]):
        variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
        assert variables["driverNamespace"] == "'gpu-system'"
        assert variables["daemonUser"].endswith("':tdp-thunder-device-plugin-daemon'")
        assert variables["operatorUser"].endswith("':tdp-thunder-device-plugin-operator'")
        assert policy["metadata"]["labels"]["app.kubernetes.io/instance"] == "tdp"
    assert not _policies(render("--set", "rbac.create=false"))


def test_config_default_names_the_install_namespace_after_kustomize() -> None:
    found = _policies(kustomize(REPO / "config" / "default"))
    assert len(found) == 2 * len(admissionpolicy.SUFFIXES)
    for policy in (o for o in found if o["kind"] == KINDS[0]):
        variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
        assert variables["driverNamespace"] == "'thunder-system'"
    # The bundle's source holds none: OLM could not install them.
    assert not _policies(kustomize(REPO / "config" / "manifests"))


def test_chart_config_and_operator_apply_the_same_rules() -> None:
    chart = _normalised(
        _policies(render(release="tdp")), "tdp-thunder-device-plugin-thunder-system"
    )
    config = _normalised(
        _policies(kustomize(REPO / "config" / "default")), admissionpolicy.OPERATOR_PREFIX
    )
    identity = operator_identity("thunder-system", "thunder-daemon", "thunder-operator")
    operator = _normalised(rendered(identity), admissionpolicy.OPERATOR_PREFIX)
    assert chart == config == operator
    assert set(chart) == {f"{kind}/{s}" for kind in KINDS for s in admissionpolicy.SUFFIXES}


@pytest.fixture(scope="module")
def csv(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out: Path = tmp_path_factory.mktemp("bundle") / "bundle"
    bundle.render(out)
    files = sorted(p.name for p in (out / "manifests").iterdir())
    assert not [f for f in files if "admissionpolic" in f.lower()], files
    import yaml

    doc: dict[str, Any] = yaml.safe_load(
        (out / "manifests" / "thunder-device-plugin.clusterserviceversion.yaml").read_text()
    )
    return doc


def test_the_bundle_has_the_operator_apply_the_policies(csv: dict[str, Any]) -> None:
    install = csv["spec"]["install"]["spec"]
    container = install["deployments"][0]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["THUNDER_APPLY_ADMISSION_POLICIES"] == "1"
    assert env["THUNDER_OPERATOR_SERVICE_ACCOUNT"] == "thunder-operator"
    assert env["THUNDER_DAEMON_SERVICE_ACCOUNT"] == "thunder-daemon"
    cluster = {p["serviceAccountName"]: p["rules"] for p in install["clusterPermissions"]}
    policy_rules = [
        r for r in cluster["thunder-operator"] if "admissionregistration.k8s.io" in r["apiGroups"]
    ]
    names = operator_identity("x", "thunder-daemon", "thunder-operator").policy_names()
    assert policy_rules == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingadmissionpolicies", "validatingadmissionpolicybindings"],
            "verbs": ["create"],
        },
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingadmissionpolicies", "validatingadmissionpolicybindings"],
            "resourceNames": names,
            "verbs": ["get", "update"],
        },
    ]
    assert not any(
        "admissionregistration.k8s.io" in r["apiGroups"] for r in cluster["thunder-daemon"]
    )


def test_the_operator_applies_policies_only_when_told() -> None:
    from thunder_dra.controllers.process.options import parse_options

    assert not parse_options([], environ={}).apply_admission_policies
    told = parse_options([], environ={"THUNDER_APPLY_ADMISSION_POLICIES": "1"})
    assert told.apply_admission_policies
    flagged = parse_options(
        ["--apply-admission-policies", "--operator-service-account", "op"], environ={}
    )
    assert (flagged.apply_admission_policies, flagged.operator_service_account) == (True, "op")


def test_the_daemon_user_is_matched_exactly() -> None:
    identity = admissionpolicy.Identity("ns", "d", "o", "p")
    [policy] = [
        o
        for o in admissionpolicy.policies(identity)
        if o["metadata"]["name"] == "p-daemon-clients" and o["kind"] == KINDS[0]
    ]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["isDaemon"] == "request.userInfo.username == variables.daemonUser"
    assert variables["daemonUser"] == "'system:serviceaccount:' + variables.driverNamespace + ':d'"
    with pytest.raises(ValueError, match="CEL string"):
        admissionpolicy.policies(admissionpolicy.Identity("n's", "d", "o", "p"))
