"""The ThunderCluster as owner, and the one update that keeps what others added."""

from __future__ import annotations

from typing import Any

from thunder_dra.controllers.shared.ownership import ThunderClusterRef, update_body

OWNER = ThunderClusterRef("thunder", "uid-1")


def desired(owner: ThunderClusterRef | None = OWNER) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": "obj",
        "labels": {"mine": "1"},
        "annotations": {"note": "new"},
    }
    if owner is not None:
        metadata["ownerReferences"] = [owner.owner_reference()]
    return {"apiVersion": "v1", "kind": "X", "metadata": metadata, "spec": {"a": 2}}


def stored(**metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "X",
        "metadata": {"name": "obj", "resourceVersion": "7", "uid": "o-1", **metadata},
        "spec": {"a": 1},
    }


def test_the_owner_reference_names_the_thundercluster_as_controller() -> None:
    assert OWNER.owner_reference() == {
        "apiVersion": "thundercompute.com/v1alpha1",
        "kind": "ThunderCluster",
        "name": "thunder",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": False,
    }


def test_an_update_keeps_the_stored_metadata_of_others_and_sets_ours() -> None:
    old = stored(
        labels={"team": "gpu", "mine": "0"},
        annotations={"other": "x"},
        finalizers=["keep"],
        managedFields=[{"manager": "kubectl"}],
    )
    body = update_body(old, desired())
    meta = body["metadata"]
    assert body["spec"] == {"a": 2}
    assert meta["resourceVersion"] == "7"
    assert meta["finalizers"] == ["keep"]
    assert "managedFields" not in meta
    assert meta["labels"] == {"team": "gpu", "mine": "1"}
    assert meta["annotations"] == {"other": "x", "note": "new"}
    assert meta["ownerReferences"] == [OWNER.owner_reference()]


def test_a_new_controller_replaces_the_old_one_and_other_owners_stay() -> None:
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "u2"}
    previous = ThunderClusterRef("thunder", "uid-0").owner_reference()
    body = update_body(stored(ownerReferences=[previous, other]), desired())
    assert body["metadata"]["ownerReferences"] == [other, OWNER.owner_reference()]


def test_our_own_reference_is_not_doubled() -> None:
    old = stored(ownerReferences=[OWNER.owner_reference()])
    assert update_body(old, desired())["metadata"]["ownerReferences"] == [OWNER.owner_reference()]


def test_without_an_owner_the_stored_owners_stay_and_none_is_added() -> None:
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "u2", "controller": True}
    assert update_body(stored(ownerReferences=[other]), desired(None))["metadata"][
        "ownerReferences"
    ] == [other]
    assert "ownerReferences" not in update_body(stored(), desired(None))["metadata"]


def test_a_stored_object_of_the_wrong_shape_is_replaced_not_an_error() -> None:
    junk = {"metadata": {"labels": 5, "annotations": [], "ownerReferences": ["x", None]}}
    meta = update_body(junk, desired())["metadata"]
    assert meta["labels"] == {"mine": "1"}
    assert meta["ownerReferences"] == [OWNER.owner_reference()]
