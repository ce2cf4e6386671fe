"""Test hooks stay out of production: reserved environment names are refused.

`spec.daemon.extraEnv` reaches the daemon container as is, so it must not be able to set
what the daemon reads for itself (its token, identity and any THUNDER_* setting such as
a crash hook) or what changes the code the privileged daemon runs (PYTHON*, LD_*).
The model (the operator's own check, which holds when the webhook is down), the webhook
and the CRD (a CEL rule the API server applies) refuse the same names.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from thunder_dra.api.crdgen import THUNDER_CLUSTER_CRD, openapi_schema
from thunder_dra.api.thundercluster import ThunderClusterSpec
from thunder_dra.api.workload import RESERVED_ENV_NAMES, RESERVED_ENV_PREFIXES
from thunder_dra.webhooks.validation import validate_thundercluster

REFUSED = [
    "THUNDER_DRA_CRASH_AT",
    "THUNDER_DRA_ANYTHING",
    "THUNDER_API_TOKEN",
    "THUNDER_NAMESPACE",
    "NODE_NAME",
    "POD_UID",
    "POD_NAMESPACE",
    "KUBECONFIG",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "LD_PRELOAD",
]
ALLOWED = ["HTTPS_PROXY", "NO_PROXY", "https_proxy", "TZ", "OTEL_RESOURCE_ATTRIBUTES", "THUNDER"]


def _spec(name: str) -> dict[str, Any]:
    return {"daemon": {"extraEnv": [{"name": "HTTPS_PROXY", "value": "x"}, {"name": name}]}}


@pytest.mark.parametrize("name", REFUSED)
def test_the_model_refuses_a_reserved_name_with_the_field_path(name: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ThunderClusterSpec.model_validate(_spec(name))
    (error,) = caught.value.errors()
    assert error["loc"][:4] == ("daemon", "extraEnv", 1, "name")
    assert name in error["msg"]
    assert "reserved" in error["msg"]


@pytest.mark.parametrize("name", REFUSED)
def test_the_webhook_refuses_a_reserved_name(name: str) -> None:
    errors = validate_thundercluster({"metadata": {"name": "t"}, "spec": _spec(name)})
    assert [error.path for error in errors] == ["spec.daemon.extraEnv[1].name"]
    assert name in errors[0].message


@pytest.mark.parametrize("name", ALLOWED)
def test_ordinary_names_are_accepted(name: str) -> None:
    spec = ThunderClusterSpec.model_validate(_spec(name))
    assert spec.daemon.extra_env[1].name == name


def _cel_refuses(rule: str, name: str) -> bool:
    """Evaluate the generated rule's shape for `name` (the API server runs it for real)."""
    prefixes = re.findall(r"self\.startsWith\('([^']*)'\)", rule)
    names = re.findall(r"'([A-Z_]+)'", rule.split(" in [", 1)[1]) if " in [" in rule else []
    return any(name.startswith(p) for p in prefixes) or name in names


def test_the_crd_carries_the_same_rule() -> None:
    spec = openapi_schema(THUNDER_CLUSTER_CRD)["properties"]["spec"]
    name = spec["properties"]["daemon"]["properties"]["extraEnv"]["items"]["properties"]["name"]
    (validation,) = name["x-kubernetes-validations"]
    for refused in REFUSED:
        assert _cel_refuses(validation["rule"], refused), refused
    for allowed in ALLOWED:
        assert not _cel_refuses(validation["rule"], allowed), allowed
    assert "reserved" in validation["message"]
    assert set(RESERVED_ENV_PREFIXES) >= {"THUNDER_", "PYTHON", "LD_"}
    assert {"NODE_NAME", "POD_UID", "POD_NAMESPACE", "KUBECONFIG"} <= set(RESERVED_ENV_NAMES)
