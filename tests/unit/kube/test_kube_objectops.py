"""The in-memory apiserver's object rules: patches and selectors as the apiserver applies them."""

from __future__ import annotations

import pytest

from tests.support.objectops import (
    Refused,
    field_matches,
    json_patch,
    label_matches,
    merge_patch,
)


def test_a_merge_patch_merges_maps_replaces_lists_and_drops_nulls() -> None:
    target = {"a": {"b": 1, "c": 2}, "l": [1, 2], "x": 1}
    assert merge_patch(target, {"a": {"b": None, "d": 3}, "l": [3], "x": None}) == {
        "a": {"c": 2, "d": 3},
        "l": [3],
    }
    assert target == {"a": {"b": 1, "c": 2}, "l": [1, 2], "x": 1}


def test_json_patch_operations_and_their_refusals() -> None:
    doc = {"metadata": {"finalizers": ["a", "b"]}, "spec": {}}
    patched = json_patch(
        doc,
        [
            {"op": "test", "path": "/metadata/finalizers/1", "value": "b"},
            {"op": "remove", "path": "/metadata/finalizers/0"},
            {"op": "add", "path": "/metadata/finalizers/-", "value": "c"},
            {"op": "replace", "path": "/spec", "value": {"n": 1}},
            {"op": "copy", "from": "/spec/n", "path": "/spec/m"},
            {"op": "move", "from": "/spec/n", "path": "/spec/a~1b"},
        ],
    )
    assert patched == {"metadata": {"finalizers": ["b", "c"]}, "spec": {"m": 1, "a/b": 1}}
    assert doc == {"metadata": {"finalizers": ["a", "b"]}, "spec": {}}
    for operations in (
        [{"op": "test", "path": "/spec", "value": 1}],
        [{"op": "remove", "path": "/missing"}],
        [{"op": "replace", "path": "/metadata/finalizers/5", "value": "x"}],
        [{"op": "frobnicate", "path": "/spec"}],
    ):
        with pytest.raises(Refused) as caught:
            json_patch(doc, operations)
        assert caught.value.status == 422


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("app=a", True),
        ("app==a", True),
        ("app=b", False),
        ("app!=b", True),
        ("tier", True),
        ("!tier", False),
        ("!other", True),
        ("app in (a, b)", True),
        ("app notin (a,b)", False),
        ("app=a,tier=web", True),
        ("app=a,tier=db", False),
        ("", True),
    ],
)
def test_label_selectors(selector: str, matches: bool) -> None:
    assert label_matches({"app": "a", "tier": "web"}, selector) is matches


def test_field_selectors_compare_dotted_fields() -> None:
    obj = {"metadata": {"name": "n1"}, "spec": {"driver": "d"}}
    assert field_matches(obj, "spec.driver=d,metadata.name=n1")
    assert not field_matches(obj, "spec.driver=e")
    assert field_matches(obj, "spec.driver!=e")
    assert not field_matches(obj, "spec.missing=x")
