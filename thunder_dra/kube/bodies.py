"""Reading Kubernetes objects as the API server hands them over (decoded JSON).

The operator and the daemon read objects they did not write: ResourceSlices and
DeviceClasses anyone with the rights may edit, tenants' ResourceClaims and Pods, Nodes as
a vendor labels them. Every read here tolerates a missing field, or one of the wrong
type, and answers with the field's empty value: "" for a string, an empty mapping or
list, 0 for a pool generation, None where None means something to the caller (no
resourceVersion precondition, no generation). None of them raises on an object's shape,
so a malformed object is skipped or reported by its caller, never the end of a pass.

Small functions over the raw mapping, as kopf's `structs/bodies`: nothing is copied but
the lists that are filtered. A slice's zone is "" when it carries none, for every caller.

The admission webhook is the exception: it validates `spec` as sent, so it reads the
raw field (a `spec` that is not a mapping must be rejected, not read as empty).
"""

# No `from __future__ import annotations`: this module defines `annotations()`, which that
# import's name would shadow for the type checker (every annotation here runs on 3.11).
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from thunder_dra.kube import naming

_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else _EMPTY


def _string(value: object) -> str:
    return value if isinstance(value, str) else ""


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _mappings(value: object) -> list[Mapping[str, Any]]:
    if not isinstance(value, list | tuple):
        return []
    return [item for item in value if isinstance(item, Mapping)]


# -- every kind ---------------------------------------------------------------------------


def metadata(obj: object) -> Mapping[str, Any]:
    return _mapping(_mapping(obj).get("metadata"))


def spec(obj: object) -> Mapping[str, Any]:
    return _mapping(_mapping(obj).get("spec"))


def status(obj: object) -> Mapping[str, Any]:
    return _mapping(_mapping(obj).get("status"))


def name(obj: object) -> str:
    return _string(metadata(obj).get("name"))


def namespace(obj: object) -> str:
    """The namespace; "" for a cluster-scoped object."""
    return _string(metadata(obj).get("namespace"))


def uid(obj: object) -> str:
    return _string(metadata(obj).get("uid"))


def creation_timestamp(obj: object) -> str:
    """As the API server wrote it (RFC 3339, UTC, so it sorts as text)."""
    return _string(metadata(obj).get("creationTimestamp"))


def resource_version(obj: object) -> str | None:
    """The resourceVersion, None without one (a write then carries no precondition)."""
    version = metadata(obj).get("resourceVersion")
    return version if isinstance(version, str) and version else None


def generation(obj: object) -> int | None:
    """`metadata.generation`; None when the object has none (or not a number)."""
    return _count(metadata(obj).get("generation"))


def labels(obj: object) -> Mapping[str, Any]:
    return _mapping(metadata(obj).get("labels"))


def annotations(obj: object) -> Mapping[str, Any]:
    return _mapping(metadata(obj).get("annotations"))


def label(obj: object, key: str) -> str | None:
    """One label's value; None when absent or not a string."""
    value = labels(obj).get(key)
    return value if isinstance(value, str) else None


def annotation(obj: object, key: str) -> str | None:
    """One annotation's value; None when absent or not a string."""
    value = annotations(obj).get(key)
    return value if isinstance(value, str) else None


def finalizers(obj: object) -> list[str]:
    """The finalizers in order; an entry that is not a string reads as "" so every other
    keeps its position (a JSON patch addresses them by index)."""
    value = metadata(obj).get("finalizers")
    if not isinstance(value, list | tuple):
        return []
    return [item if isinstance(item, str) else "" for item in value]


def owner_references(obj: object) -> list[Mapping[str, Any]]:
    """The owner references that are mappings (their fields are the caller's to read)."""
    return _mappings(metadata(obj).get("ownerReferences"))


def list_continue(page: object) -> str:
    """A list page's continue token; "" on the last page."""
    return _string(metadata(page).get("continue"))


# -- ResourceSlice (resource.k8s.io/v1) ---------------------------------------------------


def slice_pool(obj: object) -> Mapping[str, Any]:
    """`spec.pool` of a ResourceSlice."""
    return _mapping(spec(obj).get("pool"))


def pool_name(obj: object) -> str:
    """The name of the pool a ResourceSlice belongs to; "" without one."""
    return _string(slice_pool(obj).get("name"))


def pool_generation(obj: object) -> int:
    """The pool generation a ResourceSlice was published with; 0 without one."""
    return _count(slice_pool(obj).get("generation")) or 0


def driver(obj: object) -> str:
    """`spec.driver` of a ResourceSlice."""
    return _string(spec(obj).get("driver"))


def slice_zone(obj: object) -> str:
    """The Thunder zone display name a slice was published for ("" if it names none).

    The zone annotation holds the display name as Thunder spells it; the zone label,
    which carries the same name (a zone is published only where its name is a valid
    label value), answers when the annotation is missing, empty or not a string."""
    return annotation(obj, naming.ANNOTATION_ZONE) or label(obj, naming.LABEL_ZONE) or ""


def devices(obj: object) -> list[Mapping[str, Any]]:
    """`spec.devices` of a ResourceSlice, the entries that are mappings."""
    return _mappings(spec(obj).get("devices"))


def device_names(obj: object) -> list[str]:
    """The name of every device of a ResourceSlice that has a string one, in order.

    A spec that keeps its devices compressed (the operator's lean listing) and knows
    their names answers without decoding them."""
    known = getattr(spec(obj), "device_names", None)
    if isinstance(known, list):
        return [each for each in known if isinstance(each, str)]
    return [each for device in devices(obj) if isinstance(each := device.get("name"), str)]


# -- ResourceClaim (resource.k8s.io/v1) ---------------------------------------------------


def claim_requests(obj: object) -> list[Mapping[str, Any]]:
    """`spec.devices.requests` of a ResourceClaim."""
    return _mappings(_mapping(spec(obj).get("devices")).get("requests"))


def allocation(obj: object) -> Mapping[str, Any]:
    """`status.allocation` of a ResourceClaim; empty while unallocated."""
    return _mapping(status(obj).get("allocation"))


def allocation_results(obj: object) -> list[Mapping[str, Any]]:
    """`status.allocation.devices.results`: one entry per allocated device."""
    return _mappings(_mapping(allocation(obj).get("devices")).get("results"))


def allocation_config(obj: object) -> list[Mapping[str, Any]]:
    """`status.allocation.devices.config`: the opaque configurations handed to drivers."""
    return _mappings(_mapping(allocation(obj).get("devices")).get("config"))


def reserved_for(obj: object) -> list[Mapping[str, Any]]:
    """`status.reservedFor`: the consumers (pods) the claim is reserved for."""
    return _mappings(status(obj).get("reservedFor"))
