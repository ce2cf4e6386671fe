"""Kubernetes names from Thunder spellings: always valid, stable and distinct."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thunder_dra.api import syntax
from thunder_dra.kube import naming

# Thunder spellings: mostly model-like text, sometimes anything at all.
spellings = st.one_of(
    st.from_regex(r"[A-Za-z0-9 ._()/-]{0,90}", fullmatch=True),
    st.text(max_size=120),
)
labels = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", fullmatch=True)
EXAMPLES = settings(max_examples=150, deadline=None)


@pytest.mark.parametrize(
    ("spelling", "label"),
    [
        ("A6000", "a6000"),
        ("H100", "h100"),
        ("nvidia-l4", "nvidia-l4"),
        ("NVIDIA L4", "nvidia-l4"),
        ("A100 (80GB)", "a100-80gb"),
        ("RTX 6000 Ada", "rtx-6000-ada"),
        ("us-east.1", "us-east-1"),
        ("--gpu--", "gpu"),
    ],
)
def test_examples(spelling: str, label: str) -> None:
    assert naming.dns_label(spelling) == label


def test_nothing_left_becomes_a_hash() -> None:
    assert naming.dns_label("日本") == naming.short_hash("日本")
    assert naming.dns_label("!!!") != naming.dns_label("???")


@EXAMPLES
@given(spellings)
def test_labels_are_dns_labels_and_deterministic(spelling: str) -> None:
    label = naming.dns_label(spelling)
    assert syntax.is_dns_label(label)
    assert naming.dns_label(spelling) == label


@EXAMPLES
@given(labels)
def test_a_label_is_its_own_label(label: str) -> None:
    assert naming.dns_label(label) == label


@EXAMPLES
@given(st.text(alphabet="abc-", min_size=64, max_size=200), st.text(alphabet="xyz", min_size=1))
def test_long_names_sharing_a_prefix_stay_distinct(prefix: str, tail: str) -> None:
    a, b = naming.dns_label("a" + prefix), naming.dns_label("a" + prefix + tail)
    assert len(a) <= 63
    assert len(b) <= 63
    assert a != b


@EXAMPLES
@given(st.lists(spellings, max_size=12))
def test_assigned_labels_are_distinct_valid_and_order_independent(names: list[str]) -> None:
    keys = [naming.gpu_type_key(name) for name in names]
    assigned = naming.assign_labels(keys)
    assert set(assigned) == set(keys)
    assert len(set(assigned.values())) == len(assigned)
    assert all(syntax.is_dns_label(label) for label in assigned.values())
    assert naming.assign_labels(reversed(keys)) == assigned


def test_collisions_prefer_the_spelling_that_already_is_the_label() -> None:
    assigned = naming.assign_labels(["us east", "us-east", "US-East"])
    assert assigned["us-east"] == "us-east"
    assert assigned["US-East"].startswith("us-east-")
    assert assigned["us east"].startswith("us-east-")
    assert len(set(assigned.values())) == 3


def test_models_differing_only_in_case_are_one_model() -> None:
    assert naming.gpu_type_key("A6000") == naming.gpu_type_key("a6000")
    assert naming.assign_labels([naming.gpu_type_key("A6000")]) == {"a6000": "a6000"}


@EXAMPLES
@given(labels, st.integers(min_value=0, max_value=10**9))
def test_device_names_round_trip(label: str, index: int) -> None:
    name = naming.device_name(label, index)
    assert syntax.is_dns_label(name)
    assert naming.device_index(label, name) == index


@pytest.mark.parametrize(
    "name", ["a6000", "a6000-", "a6000-x", "a6000-01", "h100-1", "a6000-\u0661"]
)
def test_foreign_device_names_have_no_index(name: str) -> None:
    assert naming.device_index("a6000", name) is None


def test_device_name_of_a_long_model_fits() -> None:
    label = naming.dns_label("x" * 100)
    name = naming.device_name(label, 12345)
    assert len(name) <= 63
    assert name.endswith("-12345")


@EXAMPLES
@given(labels, labels, st.integers(min_value=0, max_value=999))
def test_slice_names_are_subdomains(zone: str, model: str, index: int) -> None:
    assert syntax.is_dns_subdomain(naming.slice_name(zone, model, index))


def test_slice_names_cannot_collide_across_pools() -> None:
    assert naming.slice_name("a-b", "c", 0) != naming.slice_name("a", "b-c", 0)


def test_pool_and_class_names() -> None:
    assert naming.pool_name("us-east", "a6000") == "us-east/a6000"
    assert naming.device_class_name("thunder-gpu-", "a6000") == "thunder-gpu-a6000"
    with pytest.raises(ValueError, match="not a DNS subdomain"):
        naming.device_class_name("Thunder-", "a6000")


@EXAMPLES
@given(labels)
def test_extended_resource_names_are_always_valid(label: str) -> None:
    name = naming.extended_resource_name("thundercompute.com/gpu-", label)
    assert name is not None
    assert naming.is_extended_resource_name(name)
    assert name.startswith("thundercompute.com/gpu-")


def test_extended_resource_name_examples() -> None:
    assert naming.extended_resource_name("thundercompute.com/gpu-", "a6000") == (
        "thundercompute.com/gpu-a6000"
    )
    assert naming.extended_resource_name("", "a6000") is None
    with pytest.raises(ValueError, match=r"kubernetes\.io"):
        naming.extended_resource_name("kubernetes.io/gpu-", "a6000")


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("thundercompute.com/gpu-a6000", True),
        ("example.com/gpu", True),
        ("gpu", False),
        ("nvidia.com/" + "g" * 64, False),
        ("kubernetes.io/gpu", False),
        ("foo.kubernetes.io/gpu", False),
        ("requests.example.com/gpu", False),
        ("Example.com/gpu", False),
        ("example.com/-gpu", False),
    ],
)
def test_is_extended_resource_name(name: str, valid: bool) -> None:
    assert naming.is_extended_resource_name(name) is valid


def test_fixed_names() -> None:
    assert naming.DRIVER_NAME == "thundercompute.com"
    assert naming.component_labels(naming.COMPONENT_DEVICE_CLASS) == {
        "app.kubernetes.io/name": "thunder-dra-driver",
        "app.kubernetes.io/component": "device-class",
    }
    assert naming.LABEL_OVERSUBSCRIPTION == "thundercompute.com/oversubscription"
    assert naming.NODE_LABEL_SERVING == "thundercompute.com/node"
    assert naming.NODE_LABEL_ZONE == "topology.kubernetes.io/zone"
    assert naming.ATTRIBUTE_GPU_TYPE == "thundercompute.com/gpu_type"
    assert naming.ATTRIBUTE_ZONE == "thundercompute.com/zone"
    assert naming.cdi_device_id("abc") == "thundercompute.com/gpu=claim-abc"
    assert naming.label_selector({"b": "2", "a": "1"}) == "a=1,b=2"
