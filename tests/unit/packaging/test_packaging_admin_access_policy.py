"""The no-admin-access policy is rendered with the install's DeviceClass prefix."""

from __future__ import annotations

from typing import Any

from tests.unit.packaging.chartkit import render
from thunder_dra.controllers.process.policies import operator_identity
from thunder_dra.kube import admissionpolicy
from thunder_dra.kube.admissionpolicy import policies

SUFFIX = "-no-admin-access"


def _policy(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [
        o
        for o in objects
        if o["kind"] == admissionpolicy.POLICY_KIND and o["metadata"]["name"].endswith(SUFFIX)
    ]
    return found


def _variables(policy: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in policy["spec"]["variables"]}


def test_the_operator_renders_it_with_the_default_prefix_and_a_binding_that_denies() -> None:
    objects = policies(operator_identity("ns", "daemon", "operator"))
    policy = _policy(objects)
    name = f"{admissionpolicy.OPERATOR_PREFIX}{SUFFIX}"
    assert policy["metadata"]["name"] == name
    assert _variables(policy)["classPrefix"] == "'thunder-gpu-'"
    (binding,) = [
        o
        for o in objects
        if o["kind"] == admissionpolicy.BINDING_KIND and o["metadata"]["name"] == name
    ]
    assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}


def test_only_creation_of_v1_claims_and_templates_is_checked_for_everyone() -> None:
    policy = _policy(policies(operator_identity("ns", "daemon", "operator")))
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule == {
        "apiGroups": ["resource.k8s.io"],
        "apiVersions": ["v1"],
        "resources": ["resourceclaims", "resourceclaimtemplates"],
        "operations": ["CREATE"],
    }
    assert "matchPolicy" not in policy["spec"]["matchConstraints"], "Equivalent, the default"
    assert policy["spec"]["failurePolicy"] == "Fail"
    (check,) = policy["spec"]["validations"]
    assert check["expression"] == "size(variables.adminRequests) == 0"
    assert "isDaemon" not in check["expression"], "it holds everyone, the driver too"
    for message in (check["message"], check["messageExpression"]):
        assert admissionpolicy.ADMIN_ACCESS_UNSUPPORTED in message
        assert admissionpolicy.ADMIN_ACCESS_REASON in message
    assert "variables.adminRequests[0]" in check["messageExpression"]


def test_the_chart_renders_its_own_prefix_and_an_empty_one_turns_the_check_off() -> None:
    variables = _variables(_policy(render("--set", "operator.deviceClassPrefix=gpu-x-").objects))
    assert variables["classPrefix"] == "'gpu-x-'"
    variables = _variables(_policy(render("--set", "operator.deviceClassPrefix=").objects))
    assert variables["classPrefix"] == "''"
    assert variables["adminRequests"].startswith(
        "variables.claimRequests.filter(r, variables.classPrefix != '' && "
    )
