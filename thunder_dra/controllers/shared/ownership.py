"""What the operator owns on the objects it writes: the ThunderCluster as their owner, and
the update that keeps what others put there.

Every object the operator publishes (ResourceSlices, DeviceClasses, the daemon
DaemonSet) names the ThunderCluster as its controlling owner, so deleting the
ThunderCluster makes the garbage collector remove them. An update replaces the spec and
the operator's own labels, annotations and owner reference, and keeps every other
label, annotation, finalizer and owner reference someone else added.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from thunder_dra.api.constants import API_VERSION, THUNDER_CLUSTER_KIND
from thunder_dra.kube import bodies


@dataclass(frozen=True, slots=True)
class ThunderClusterRef:
    """The ThunderCluster that owns the operator's objects, by name and uid."""

    name: str
    uid: str

    def owner_reference(self) -> dict[str, Any]:
        """Its controlling owner reference. It does not block the owner's deletion: that
        would need the right to update the ThunderCluster's finalizers, and nothing waits
        on these objects."""
        return {
            "apiVersion": API_VERSION,
            "kind": THUNDER_CLUSTER_KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": False,
        }


def update_body(stored: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """`desired` on top of `stored`'s metadata, for a replace (PUT).

    The stored metadata is kept (its resourceVersion makes the write conditional), less
    managedFields; `desired`'s labels and annotations are set over the stored ones, and
    its owner references replace those with the same uid. Only one owner may be the
    controller: when `desired` names one, a stored controller (a ThunderCluster deleted
    and created again) gives way to it."""
    have = {key: value for key, value in bodies.metadata(stored).items() if key != "managedFields"}
    wanted_owners = list(bodies.owner_references(desired))
    wanted_uids = {ref.get("uid") for ref in wanted_owners}
    takes_control = any(ref.get("controller") for ref in wanted_owners)
    owners = [
        ref
        for ref in bodies.owner_references(stored)
        if ref.get("uid") not in wanted_uids and not (takes_control and ref.get("controller"))
    ]
    metadata = {
        **have,
        "labels": {**bodies.labels(stored), **bodies.labels(desired)},
        "annotations": {**bodies.annotations(stored), **bodies.annotations(desired)},
    }
    if owners or wanted_owners:
        metadata["ownerReferences"] = owners + wanted_owners
    return {**desired, "metadata": metadata}
