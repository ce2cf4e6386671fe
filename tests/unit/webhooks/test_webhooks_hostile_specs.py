"""Hostile ThunderCluster specs: the webhook and the operator's parsing never crash.

Specs are generated from the CRD's own schema, so every field is reached, with values
that are sometimes right and often hostile: unicode and very long strings, huge,
negative and non-finite numbers, wrong types, huge durations. Whatever comes in, the
webhook's validation returns field errors (never raises) and each error names a path
into the object; the operator's model parsing raises nothing but a ValidationError.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from thunder_dra.api.crdgen import THUNDER_CLUSTER_CRD, openapi_schema
from thunder_dra.api.duration import DURATION_PATTERN
from thunder_dra.api.thundercluster import ThunderCluster, ThunderClusterSpec
from thunder_dra.webhooks.admission import review_thundercluster
from thunder_dra.webhooks.validation import FieldError, validate_thundercluster

SPEC_SCHEMA = openapi_schema(THUNDER_CLUSTER_CRD)["properties"]["spec"]

_HOSTILE_STRINGS = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=60, max_size=400),
    st.sampled_from(
        [
            "",
            "99999999999999999999h",
            "-99999999999999999999h",
            "2562048h",
            "1e400s",
            "9" * 63 + "s",
            "NaN",
            "-1",
            "0",
            "\x00",
            "\u202e\u0000\ud7ff",
            "thundercompute.com/gpu-",
            "https://example.com",
            "http://10.0.0.1",
            "THUNDER_DRA_CRASH_AT",
        ]
    ),
)
_HOSTILE_NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.sampled_from([0, -1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
)
_DURATIONS = st.one_of(
    st.builds(
        "{}{}{}".format,
        st.sampled_from(["", "-", "+"]),
        st.one_of(
            st.integers(min_value=0, max_value=10**6),
            st.integers(min_value=10**15, max_value=10**50),
            st.sampled_from([".5", "1.", "0", "2562047", "2562048", "9" * 40]),
        ),
        st.sampled_from(["ns", "us", "ms", "s", "m", "h"]),
    ),
    _HOSTILE_STRINGS,
)
_ANY_SCALAR = st.one_of(
    st.none(), st.booleans(), _HOSTILE_NUMBERS, _HOSTILE_STRINGS, st.just([]), st.just({})
)


_STRATEGIES: dict[tuple[int, int], tuple[dict[str, Any], st.SearchStrategy[Any]]] = {}


def _for_schema(node: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values for `node`: of its type (bounds ignored) most often, anything sometimes.

    Built once per schema node and depth: the tests draw from these inside every example,
    and a strategy built afresh is validated and labelled afresh by hypothesis each time,
    which cost more than the examples themselves. The entry keeps its node alive, so the
    node's id stays a key no other node can take.
    """
    key = (id(node), depth)
    if key not in _STRATEGIES:
        _STRATEGIES[key] = (node, _build_for_schema(node, depth))
    return _STRATEGIES[key][1]


def _build_for_schema(node: dict[str, Any], depth: int) -> st.SearchStrategy[Any]:
    kind = node.get("type")
    if node.get("x-kubernetes-int-or-string"):
        typed: st.SearchStrategy[Any] = st.one_of(_HOSTILE_NUMBERS, _HOSTILE_STRINGS)
    elif "enum" in node:
        typed = st.one_of(st.sampled_from(node["enum"]), _HOSTILE_STRINGS)
    elif kind == "string" and node.get("pattern") == DURATION_PATTERN:
        typed = _DURATIONS
    elif kind == "string":
        typed = _HOSTILE_STRINGS
    elif kind in ("integer", "number"):
        typed = _HOSTILE_NUMBERS
    elif kind == "boolean":
        typed = st.booleans()
    elif kind == "array" and depth < 6:
        typed = st.lists(_for_schema(node.get("items", {}), depth + 1), max_size=4)
    elif kind == "object" and "properties" in node and depth < 6:
        typed = st.fixed_dictionaries(
            {},
            optional={
                name: _for_schema(child, depth + 1) for name, child in node["properties"].items()
            },
        )
    elif kind == "object" and depth < 6:
        values = _for_schema(node.get("additionalProperties") or {}, depth + 1)
        typed = st.dictionaries(_HOSTILE_STRINGS, values, max_size=4)
    else:
        typed = _ANY_SCALAR
    return st.one_of(typed, typed, typed, _ANY_SCALAR)


_MAP_KEY = "<key>"


def _fields(node: dict[str, Any], path: tuple[str | int, ...] = ()) -> list[tuple[Any, ...]]:
    """(path, schema) of every field of the spec; lists by their first item, maps by a key."""
    found: list[tuple[Any, ...]] = [(path, node)] if path else []
    for name, child in (node.get("properties") or {}).items():
        found += _fields(child, (*path, name))
    if isinstance(node.get("items"), dict):
        found += _fields(node["items"], (*path, 0))
    if isinstance(node.get("additionalProperties"), dict):
        found += _fields(node["additionalProperties"], (*path, _MAP_KEY))
    return found


FIELDS = _fields(SPEC_SCHEMA)
DEFAULT_SPEC = ThunderClusterSpec().to_json_dict()


def _set(document: Any, path: tuple[Any, ...], value: Any, key: str) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(head, int):
        items = list(document) if isinstance(document, list) else []
        if not items:
            items.append({})
        items[0] = _set(items[0], rest, value, key)
        return items
    mapping = dict(document) if isinstance(document, dict) else {}
    name = key if head == _MAP_KEY else head
    mapping[name] = _set(mapping.get(name), rest, value, key)
    return mapping


# Built once, like `_for_schema`'s strategies, rather than in every draw.
_MUTATIONS = st.integers(min_value=1, max_value=4)
_FIELD = st.sampled_from(FIELDS)
_MAP_KEYS = st.one_of(st.sampled_from(["kubernetes.io/os", "a"]), _HOSTILE_STRINGS)
_FIELD_MAP_KEYS = st.one_of(st.just("a"), _HOSTILE_STRINGS)


@st.composite
def _mutated_defaults(draw: st.DrawFn) -> Any:
    """The defaulted spec with a few fields replaced by hostile values."""
    spec: Any = DEFAULT_SPEC
    for _ in range(draw(_MUTATIONS)):
        path, node = draw(_FIELD)
        key = draw(_MAP_KEYS)
        spec = _set(spec, path, draw(_for_schema(node, depth=4)), key)
    return spec


SPECS = st.one_of(_mutated_defaults(), _mutated_defaults(), _for_schema(SPEC_SCHEMA), _ANY_SCALAR)


def _walk(document: Any, parts: list[str | int]) -> bool:
    value = document
    for part in parts:
        in_dict = isinstance(value, dict) and part in value
        in_list = isinstance(value, list) and isinstance(part, int) and part < len(value)
        if not (in_dict or in_list):
            return False
        value = value[part]
    return True


def _assert_names_a_field(spec: Any, error: FieldError) -> None:
    assert error.message, error
    if error.path == "metadata.name":
        return
    assert error.path.startswith("spec"), error
    if not isinstance(spec, dict):
        return
    # Every error is about a field of the spec, never the spec as a whole, and all but
    # the last step of its path is in the object (the last may be a required field
    # that is missing).
    assert error.path != "spec", error


def _errors_with_locations(spec: Any) -> list[tuple[tuple[str | int, ...], str]]:
    try:
        ThunderClusterSpec.model_validate(spec if spec is not None else {})
    except ValidationError as exc:
        return [(tuple(e["loc"]), e["msg"]) for e in exc.errors()]
    return []


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=SPECS)
def test_the_webhook_never_crashes_and_names_a_field_for_every_error(spec: Any) -> None:
    obj: dict[str, Any] = {"kind": "ThunderCluster", "metadata": {"name": "thunder"}}
    obj["spec"] = spec
    errors = validate_thundercluster(obj)
    for error in errors:
        _assert_names_a_field(spec, error)
    for loc, message in _errors_with_locations(spec):
        assert message
        if isinstance(spec, dict):
            assert loc, "an error about the spec as a whole"
            assert _walk(spec, list(loc[:-1])), loc


@pytest.mark.parametrize(
    ("path", "node"), FIELDS, ids=[".".join(map(str, path)) for path, _ in FIELDS]
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_field_with_hostile_values_gives_field_errors_only(
    path: tuple[Any, ...], node: dict[str, Any], data: st.DataObject
) -> None:
    key = data.draw(_FIELD_MAP_KEYS, label="key")
    spec = _set(DEFAULT_SPEC, path, data.draw(_for_schema(node, depth=4), label="value"), key)
    obj = {"metadata": {"name": "thunder"}, "spec": spec}
    for error in validate_thundercluster(obj):
        _assert_names_a_field(spec, error)
    for loc, message in _errors_with_locations(spec):
        assert message
        assert loc, "an error about the spec as a whole"
        assert _walk(spec, list(loc[:-1])), loc


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(old=SPECS, new=SPECS)
def test_an_update_from_any_stored_spec_to_any_other_never_crashes(old: Any, new: Any) -> None:
    before = {"metadata": {"name": "thunder"}, "spec": old}
    after = {"metadata": {"name": "thunder"}, "spec": new}

    async def names() -> Collection[str]:
        return ["thunder"]

    async def published() -> bool:
        return True

    message = asyncio.run(review_thundercluster(after, before, names, published))
    assert message is None or message.startswith(("spec", "metadata"))
    for error in validate_thundercluster(after, old=before, objects_published=True):
        _assert_names_a_field(new, error)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=SPECS)
def test_the_operators_parsing_raises_only_a_validation_error(spec: Any) -> None:
    body = {"apiVersion": "thundercompute.com/v1alpha1", "kind": "ThunderCluster", "spec": spec}
    try:
        parsed = ThunderCluster.model_validate(body)
    except ValidationError as exc:
        locations = [error["loc"] for error in exc.errors()]
    else:
        locations = []
    assert all(loc[:1] == ("spec",) for loc in locations), locations
    if locations:
        return
    # What parses is usable: every duration converts and stays in range.
    operator = parsed.spec.operator
    assert operator.reconcile_interval.to_timedelta().total_seconds() > 0
    assert operator.orphan_grace_period.to_timedelta().total_seconds() > 0


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        (
            {"operator": {"reconcileInterval": "99999999999999999999h"}},
            "spec.operator.reconcileInterval",
        ),
        ({"operator": {"orphanGracePeriod": "1e400s"}}, "spec.operator.orphanGracePeriod"),
        ({"operator": {"inventoryConcurrency": 10**400}}, "spec.operator.inventoryConcurrency"),
        ({"operator": {"limits": {"maxPools": -1}}}, "spec.operator.limits.maxPools"),
        ({"nvidia": {"minDriverVersion": 2**63}}, "spec.nvidia.minDriverVersion"),
        (
            {"daemon": {"tolerations": [{"operator": "Exists", "tolerationSeconds": 2**63}]}},
            "spec.daemon.tolerations[0].tolerationSeconds",
        ),
        (
            {"daemon": {"resources": {"limits": {"memory": -(10**40)}}}},
            "spec.daemon.resources.limits.memory",
        ),
    ],
)
def test_the_webhook_refuses_out_of_range_input_naming_the_field(
    spec: dict[str, Any], path: str
) -> None:
    async def names() -> Collection[str]:
        return []

    async def published() -> bool:
        return False

    obj = {"metadata": {"name": "thunder"}, "spec": spec}
    message = asyncio.run(review_thundercluster(obj, None, names, published))
    assert message is not None
    assert message.startswith(f"{path}: "), message
