"""Reading objects: well-formed ones read as written, any shape reads without raising."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thunder_dra.controllers.shared.objects import LeanSliceSpec
from thunder_dra.kube import bodies, naming

EXAMPLES = settings(max_examples=300, deadline=None)

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
KEYS = [
    "metadata",
    "spec",
    "status",
    "name",
    "namespace",
    "uid",
    "labels",
    "annotations",
    "finalizers",
    "ownerReferences",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "continue",
    "pool",
    "driver",
    "devices",
    "allocation",
    "results",
    "config",
    "reservedFor",
    naming.ANNOTATION_ZONE,
    naming.LABEL_ZONE,
]
junk = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), inner, max_size=5)
    ),
    max_leaves=30,
)

READERS: list[Callable[[object], object]] = [
    bodies.metadata,
    bodies.spec,
    bodies.status,
    bodies.name,
    bodies.namespace,
    bodies.uid,
    bodies.creation_timestamp,
    bodies.resource_version,
    bodies.generation,
    bodies.labels,
    bodies.annotations,
    bodies.finalizers,
    bodies.owner_references,
    bodies.list_continue,
    bodies.slice_pool,
    bodies.pool_name,
    bodies.pool_generation,
    bodies.driver,
    bodies.slice_zone,
    bodies.devices,
    bodies.device_names,
    bodies.allocation,
    bodies.allocation_results,
    bodies.allocation_config,
    bodies.reserved_for,
]


@EXAMPLES
@given(junk)
def test_no_reader_raises_on_any_shape(obj: Any) -> None:
    for read in READERS:
        read(obj)
    bodies.label(obj, naming.LABEL_ZONE)
    bodies.annotation(obj, naming.ANNOTATION_ZONE)


@EXAMPLES
@given(junk)
def test_readers_answer_in_their_declared_types(obj: Any) -> None:
    for read in (bodies.metadata, bodies.spec, bodies.status, bodies.labels, bodies.annotations):
        assert isinstance(read(obj), Mapping)
    for text in (
        bodies.name,
        bodies.namespace,
        bodies.uid,
        bodies.creation_timestamp,
        bodies.pool_name,
        bodies.driver,
        bodies.slice_zone,
        bodies.list_continue,
    ):
        assert isinstance(text(obj), str)
    assert all(isinstance(f, str) for f in bodies.finalizers(obj))
    assert all(isinstance(n, str) for n in bodies.device_names(obj))
    for listing in (
        bodies.owner_references,
        bodies.devices,
        bodies.allocation_results,
        bodies.allocation_config,
        bodies.reserved_for,
    ):
        assert all(isinstance(item, Mapping) for item in listing(obj))
    generation = bodies.pool_generation(obj)
    assert type(generation) is int
    version = bodies.resource_version(obj)
    assert version is None or (isinstance(version, str) and version)
    assert bodies.generation(obj) is None or type(bodies.generation(obj)) is int


@EXAMPLES
@given(st.dictionaries(st.sampled_from(KEYS), junk, max_size=4))
def test_junk_beside_good_fields_does_not_hide_them(meta: dict[str, Any]) -> None:
    obj = {"metadata": meta, "spec": {"pool": meta, "devices": [meta, {"name": "d-0"}, 5]}}
    assert "d-0" in bodies.device_names(obj)
    zones = [
        value
        for key, field in (("annotations", naming.ANNOTATION_ZONE), ("labels", naming.LABEL_ZONE))
        if isinstance(meta.get(key), dict)
        for value in (meta[key].get(field),)
        if isinstance(value, str)
    ]
    assert bodies.slice_zone(obj) in ["", *zones]


SLICE: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice",
    "metadata": {
        "name": "us-east-a6000-0",
        "uid": "u-1",
        "resourceVersion": "42",
        "generation": 3,
        "creationTimestamp": "2026-01-02T03:04:05Z",
        "labels": {naming.LABEL_ZONE: "us-east"},
        "annotations": {naming.ANNOTATION_ZONE: "US East"},
        "finalizers": ["a", "b"],
        "ownerReferences": [{"uid": "c-1", "controller": True}],
    },
    "spec": {
        "driver": naming.DRIVER_NAME,
        "pool": {"name": "us-east/a6000", "generation": 7, "resourceSliceCount": 1},
        "devices": [{"name": "a6000-0"}, {"name": "a6000-1"}],
    },
}


def test_a_well_formed_slice_reads_as_written() -> None:
    assert bodies.name(SLICE) == "us-east-a6000-0"
    assert bodies.uid(SLICE) == "u-1"
    assert bodies.namespace(SLICE) == ""
    assert bodies.resource_version(SLICE) == "42"
    assert bodies.generation(SLICE) == 3
    assert bodies.creation_timestamp(SLICE) == "2026-01-02T03:04:05Z"
    assert bodies.finalizers(SLICE) == ["a", "b"]
    assert bodies.owner_references(SLICE) == [{"uid": "c-1", "controller": True}]
    assert bodies.pool_name(SLICE) == "us-east/a6000"
    assert bodies.pool_generation(SLICE) == 7
    assert bodies.driver(SLICE) == naming.DRIVER_NAME
    assert bodies.device_names(SLICE) == ["a6000-0", "a6000-1"]
    assert bodies.label(SLICE, naming.LABEL_ZONE) == "us-east"
    assert bodies.annotation(SLICE, naming.ANNOTATION_ZONE) == "US East"


def test_a_slice_names_its_zone_by_annotation_then_label_else_empty() -> None:
    assert bodies.slice_zone(SLICE) == "US East"
    by_label = {"metadata": {"labels": {naming.LABEL_ZONE: "us-east"}}}
    assert bodies.slice_zone(by_label) == "us-east"
    assert bodies.slice_zone({"metadata": {}}) == ""
    assert bodies.slice_zone({"metadata": {"annotations": {naming.ANNOTATION_ZONE: 5}}}) == ""
    empty_annotation = {
        "metadata": {
            "annotations": {naming.ANNOTATION_ZONE: ""},
            "labels": {naming.LABEL_ZONE: "us-east"},
        }
    }
    assert bodies.slice_zone(empty_annotation) == "us-east"


def test_a_lean_spec_gives_its_device_names_without_decoding() -> None:
    lean = {**SLICE, "spec": LeanSliceSpec(SLICE["spec"])}
    assert bodies.device_names(lean) == ["a6000-0", "a6000-1"]
    assert bodies.pool_name(lean) == "us-east/a6000"


def test_a_claims_allocation_reads_its_results_config_and_consumers() -> None:
    claim = {
        "metadata": {"name": "c", "namespace": "t", "uid": "u"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"driver": "d", "pool": "p", "device": "x"}, "junk"],
                    "config": [{"opaque": {}}],
                }
            },
            "reservedFor": [{"resource": "pods", "name": "pod"}],
        },
    }
    assert bodies.namespace(claim) == "t"
    assert bodies.allocation_results(claim) == [{"driver": "d", "pool": "p", "device": "x"}]
    assert bodies.allocation_config(claim) == [{"opaque": {}}]
    assert bodies.reserved_for(claim) == [{"resource": "pods", "name": "pod"}]
    assert bodies.allocation({"status": {"allocation": None}}) == {}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"metadata": {"generation": True}}, None),
        ({"metadata": {"generation": "3"}}, None),
        ({"metadata": {"generation": 0}}, 0),
        ({}, None),
    ],
)
def test_a_generation_is_a_number_or_none(obj: dict[str, Any], expected: int | None) -> None:
    assert bodies.generation(obj) == expected


def test_finalizers_keep_their_positions_for_a_patch_by_index() -> None:
    obj = {"metadata": {"finalizers": [1, "x", None, "y"]}}
    assert bodies.finalizers(obj) == ["", "x", "", "y"]
    assert bodies.finalizers(obj).index("y") == 3


def test_an_empty_resource_version_is_no_precondition() -> None:
    assert bodies.resource_version({"metadata": {"resourceVersion": ""}}) is None
    assert bodies.resource_version({"metadata": {"resourceVersion": 7}}) is None
