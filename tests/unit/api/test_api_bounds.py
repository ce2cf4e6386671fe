"""Out-of-range input is a validation error naming its field, never a crash.

The operator parses a stored ThunderCluster with these models even when the webhook is
down, so huge durations and numbers must come back as a pydantic ValidationError with a
field path, and the generated CRD must bound every string and number so the API server
refuses them first.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from thunder_dra.api.client import ClientSpec
from thunder_dra.api.crdgen import CLIENT_CRD, THUNDER_CLUSTER_CRD, openapi_schema
from thunder_dra.api.duration import DURATION_MAX_LENGTH, parse_duration
from thunder_dra.api.thundercluster import ThunderClusterSpec

HUGE_DURATIONS = [
    "99999999999999999999h",
    "2562048h",  # just past Go's largest duration (int64 nanoseconds)
    "9" * 62 + "h",
    "1" + "0" * 40 + "ns",
    "-99999999999999999999h",
    "99999999999999999999.99999999999999999999h",
]


@pytest.mark.parametrize("text", HUGE_DURATIONS)
def test_a_duration_beyond_gos_range_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="out of range"):
        parse_duration(text)


def test_the_largest_go_duration_still_parses() -> None:
    assert parse_duration("2562047h").total_seconds() == 2562047 * 3600


@pytest.mark.parametrize("text", [*HUGE_DURATIONS, "1e400s", "x" * 10_000])
@pytest.mark.parametrize("field", ["reconcileInterval", "orphanGracePeriod"])
def test_a_huge_duration_in_the_spec_is_a_validation_error_with_the_path(
    field: str, text: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        ThunderClusterSpec.model_validate({"operator": {field: text}})
    assert [e["loc"] for e in caught.value.errors()] == [("operator", field)]


@pytest.mark.parametrize("number", [10**400, -(10**400), 2**63, -(2**63) - 1, 1e308, -1])
@pytest.mark.parametrize(
    "spec",
    [
        lambda n: {"operator": {"inventoryConcurrency": n}},
        lambda n: {"operator": {"limits": {"maxPools": n}}},
        lambda n: {"operator": {"inventoryProtection": {"confirmPasses": n}}},
        lambda n: {"nvidia": {"minDriverVersion": n}},
        lambda n: {"daemon": {"thunderdPortRange": {"start": n}}},
        lambda n: {"daemon": {"tolerations": [{"operator": "Exists", "tolerationSeconds": n}]}},
        lambda n: {"daemon": {"resources": {"limits": {"memory": n}}}},
    ],
)
def test_a_huge_or_negative_number_is_a_validation_error(spec: Any, number: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        ThunderClusterSpec.model_validate(spec(number))
    assert all(error["loc"] for error in caught.value.errors())


@pytest.mark.parametrize("number", [10**400, 2**63, 0, -1])
def test_a_client_gpu_count_out_of_range_is_a_validation_error(number: int) -> None:
    spec = {
        "claim": {"namespace": "ns", "name": "c", "uid": "u"},
        "nodeName": "n",
        "zone": {"name": "z", "id": "z1"},
        "gpuType": "A6000",
        "gpuCount": number,
    }
    with pytest.raises(ValidationError) as caught:
        ClientSpec.model_validate(spec)
    assert [e["loc"] for e in caught.value.errors()] == [("gpuCount",)]


def _leaves(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from _leaves(child, f"{path}.{name}")
    for key, suffix in (("items", "[]"), ("additionalProperties", "{}")):
        if isinstance(node.get(key), dict):
            yield from _leaves(node[key], path + suffix)


def _unbounded(schema: dict[str, Any]) -> list[str]:
    problems = []
    for path, node in _leaves(schema, ""):
        kind = node.get("type")
        int_or_string = node.get("x-kubernetes-int-or-string")
        # enum and date-time strings are bounded by their own validation.
        stringy = (kind == "string" or int_or_string) and not ({"enum", "format"} & set(node))
        if stringy and "maxLength" not in node:
            problems.append(f"{path}: string without maxLength")
        numeric = kind in ("integer", "number") or int_or_string
        if numeric and ("minimum" not in node or "maximum" not in node):
            problems.append(f"{path}: number without minimum and maximum")
        if kind == "array" and "maxItems" not in node:
            problems.append(f"{path}: list without maxItems")
        if kind == "object" and "additionalProperties" in node and "maxProperties" not in node:
            problems.append(f"{path}: map without maxProperties")
    return problems


def test_every_string_number_list_and_map_of_the_thundercluster_crd_is_bounded() -> None:
    properties = openapi_schema(THUNDER_CLUSTER_CRD)["properties"]
    assert _unbounded(properties["spec"]) == []
    assert _unbounded(properties["status"]) == []


def test_every_string_and_number_of_the_client_spec_is_bounded() -> None:
    assert _unbounded(openapi_schema(CLIENT_CRD)["properties"]["spec"]) == []


def test_durations_are_range_checked_by_the_api_server_too() -> None:
    spec = openapi_schema(THUNDER_CLUSTER_CRD)["properties"]["spec"]
    interval = spec["properties"]["operator"]["properties"]["reconcileInterval"]
    assert interval["maxLength"] == DURATION_MAX_LENGTH
    rules = [rule["rule"] for rule in interval["x-kubernetes-validations"]]
    assert rules == ["duration(self) >= duration('5s') && duration(self) <= duration('24h')"]
