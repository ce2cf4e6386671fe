"""The one-model-per-claim policy is rendered with the install's prefixes."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.packaging.chartkit import render
from thunder_dra.controllers.process.policies import operator_identity
from thunder_dra.kube import admissionpolicy
from thunder_dra.kube.admissionpolicy import Identity, policies

SUFFIX = "-one-model-per-claim"


def _policy(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [
        o
        for o in objects
        if o["kind"] == admissionpolicy.POLICY_KIND and o["metadata"]["name"].endswith(SUFFIX)
    ]
    return found


def _variables(policy: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in policy["spec"]["variables"]}


def test_the_operator_renders_the_default_prefixes() -> None:
    identity = operator_identity("ns", "daemon", "operator")
    policy = _policy(policies(identity))
    variables = _variables(policy)
    assert variables["classPrefix"] == "'thunder-gpu-'"
    assert variables["resourcePrefix"] == "'thundercompute.com/gpu-'"
    assert policy["metadata"]["name"] == f"{admissionpolicy.OPERATOR_PREFIX}{SUFFIX}"


def test_only_creation_of_claims_templates_and_pods_is_checked() -> None:
    policy = _policy(policies(operator_identity("ns", "daemon", "operator")))
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert [(r["apiGroups"], r["resources"], r["operations"]) for r in rules] == [
        (["resource.k8s.io"], ["resourceclaims", "resourceclaimtemplates"], ["CREATE"]),
        ([""], ["pods"], ["CREATE"]),
    ]
    assert policy["spec"]["failurePolicy"] == "Fail"
    for check in policy["spec"]["validations"]:
        assert check["message"].startswith(admissionpolicy.ONE_MODEL_REASON)
        assert admissionpolicy.ONE_MODEL_REASON in check["messageExpression"]
        assert "isDaemon" not in check["expression"], "it holds everyone, the driver too"


def test_the_chart_renders_its_own_prefixes() -> None:
    m = render(
        "--set",
        "operator.deviceClassPrefix=gpu-x-",
        "--set",
        "operator.extendedResourcePrefix=example.com/x-",
    )
    variables = _variables(_policy(m.objects))
    assert variables["classPrefix"] == "'gpu-x-'"
    assert variables["resourcePrefix"] == "'example.com/x-'"


def test_an_empty_prefix_turns_its_half_of_the_check_off() -> None:
    m = render("--set", "operator.deviceClassPrefix=", "--set", "operator.extendedResourcePrefix=")
    variables = _variables(_policy(m.objects))
    assert variables["classPrefix"] == "''"
    assert variables["resourcePrefix"] == "''"
    assert "variables.classPrefix != ''" in variables["thunderClasses"]
    assert variables["thunderResources"].startswith("variables.resourcePrefix == '' ? []")


def test_a_prefix_that_cannot_be_a_cel_string_is_refused() -> None:
    identity = Identity("ns", "d", "o", "p", device_class_prefix="x'y")
    with pytest.raises(ValueError, match="CEL string literal"):
        policies(identity)
