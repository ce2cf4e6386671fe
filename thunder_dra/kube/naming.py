"""Every Kubernetes name, label and annotation the driver writes, in one place.

Thunder spells zones and GPU models freely ("A6000", "NVIDIA L4", "us east"), but
Kubernetes names are DNS labels. The rules (thunder-api.md 7.5), decided here once:

- lower-case; each run of characters outside [a-z0-9-] becomes one '-' (a '-'
  already there is kept, so a name that is already a label is its own label);
  no leading or trailing '-';
- longer than allowed: cut, and end with '-' and 8 hex digits of the SHA-256 of the
  original, so two long names sharing a prefix stay distinct and the result is
  the same on every run; a name with nothing left (e.g. all non-ASCII) becomes
  those 8 hex digits alone;
- two spellings that normalise to the same label (e.g. "US-East" and "us east"):
  `assign_labels` keeps the plain label for the spelling already in normal form,
  else for the lexicographically smallest one, and suffixes the others with their
  hash. GPU models are compared ignoring case (thunder-api.md 7.5), so "A6000" and "a6000" are
  one model and never collide.

The original spelling is always kept beside the label (annotations, attributes,
status); it is never reconstructed from the label.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Final

from thunder_dra.api import constants, syntax
from thunder_dra.api.constants import DOMAIN

DRIVER_NAME: Final = constants.DEFAULT_DRIVER_NAME
"""Default DRA driver name (ThunderCluster `spec.operator.driverName`)."""
APP_NAME: Final = constants.APP_NAME
"""Value of `app.kubernetes.io/name` on everything the driver creates."""

# Labels on everything the driver creates.
LABEL_APP_NAME: Final = "app.kubernetes.io/name"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
COMPONENT_OPERATOR: Final = "operator"
COMPONENT_DAEMON: Final = "daemon"
COMPONENT_RESOURCE_INVENTORY: Final = "resource-inventory"
COMPONENT_DEVICE_CLASS: Final = "device-class"
MANAGED_BY: Final = "thunder-operator"

# Labels and annotations on ResourceSlices and DeviceClasses.
LABEL_OVERSUBSCRIPTION: Final = f"{DOMAIN}/oversubscription"
LABEL_GPU_TYPE: Final = f"{DOMAIN}/gpu-type"
"""The model's DNS label, for `kubectl get -l`."""
LABEL_ZONE: Final = f"{DOMAIN}/zone"
"""The zone's display name (always a valid label value on a published slice)."""
ANNOTATION_GPU_TYPE: Final = f"{DOMAIN}/thunder-gpu-type"
"""The model exactly as Thunder spells it."""
ANNOTATION_ZONE: Final = f"{DOMAIN}/thunder-zone"
"""The zone display name exactly as Thunder spells it."""

# Device attributes (qualified, so they do not depend on the configured driver name).
ATTRIBUTE_DOMAIN: Final = DOMAIN
ATTRIBUTE_GPU_TYPE: Final = f"{DOMAIN}/gpu_type"
"""The model as Thunder spells it (omitted if over the 64-character attribute limit)."""
ATTRIBUTE_GPU_TYPE_LABEL: Final = f"{DOMAIN}/gpu_type_label"
"""The model's DNS label; DeviceClass selectors match on it."""
ATTRIBUTE_ZONE: Final = f"{DOMAIN}/zone"
"""The zone display name."""
ATTRIBUTE_STRING_MAX: Final = 64

# Node labels.
NODE_LABEL_SERVING: Final = f"{DOMAIN}/node"
NODE_LABEL_ZONE: Final = "topology.kubernetes.io/zone"
NODE_LABEL_ADVERTISED_IP: Final = f"{DOMAIN}/advertised-ip"

CDI_KIND: Final = f"{DOMAIN}/gpu"

SLICE_NAME_PREFIX: Final = "thunder"
DEVICE_TYPE_MAX: Final = 52
"""Longest model part of a device name: leaves '-' and 10 index digits within 63."""
_HASH_LENGTH: Final = 8
_NOT_LABEL_CHARS: Final = re.compile(r"[^a-z0-9-]+")


def short_hash(value: str) -> str:
    """8 hex digits of the SHA-256 of `value`: the stable suffix of shortened names."""
    return hashlib.sha256(value.encode("utf-8")).hexdigest()[:_HASH_LENGTH]


def _with_hash(base: str, digest_of: str, max_length: int) -> str:
    head = base[: max_length - _HASH_LENGTH - 1].rstrip("-")
    return f"{head}-{short_hash(digest_of)}" if head else short_hash(digest_of)


def dns_label(value: str, *, max_length: int = syntax.DNS_LABEL_MAX) -> str:
    """The DNS label for a Thunder spelling (see the module docstring for the rules)."""
    if max_length <= _HASH_LENGTH:
        raise ValueError(f"max_length must exceed {_HASH_LENGTH}, got {max_length}")
    label = _NOT_LABEL_CHARS.sub("-", value.lower()).strip("-")
    if not label:
        return short_hash(value)
    if len(label) > max_length:
        return _with_hash(label, value, max_length)
    return label


def shorten_label(label: str, max_length: int) -> str:
    """`label` cut to `max_length` with a hash suffix, or unchanged if it fits."""
    if len(label) <= max_length:
        return label
    return _with_hash(label, label, max_length)


def gpu_type_key(spelling: str) -> str:
    """Identity of a GPU model: Thunder comparisons ignore case (thunder-api.md 7.5)."""
    return spelling.casefold()


def assign_labels(keys: Iterable[str]) -> dict[str, str]:
    """A distinct DNS label for each key; the same keys always get the same labels.

    For GPU models pass `gpu_type_key(spelling)`; for zones the exact display name.
    """
    by_label: defaultdict[str, list[str]] = defaultdict(list)
    for key in set(keys):
        by_label[dns_label(key)].append(key)
    result: dict[str, str] = {}
    for label, owners in by_label.items():
        # The spelling that already is the label keeps it; otherwise the smallest one.
        owners.sort(key=lambda key: (key != label, key))
        result[owners[0]] = label
        for key in owners[1:]:
            result[key] = _with_hash(label, key, syntax.DNS_LABEL_MAX)
    return result


def pool_name(zone_label: str, type_label: str) -> str:
    """ResourceSlice pool of a zone and a model: `<zone>/<type>`."""
    return f"{zone_label}/{type_label}"


def device_name(type_label: str, index: int) -> str:
    """Device `<type>-<n>`; a long model part is shortened so the name stays a DNS label."""
    if index < 0:
        raise ValueError(f"device index must not be negative, got {index}")
    return f"{shorten_label(type_label, DEVICE_TYPE_MAX)}-{index}"


def device_index(type_label: str, name: str) -> int | None:
    """The index of a device name made by `device_name(type_label, n)`, else None."""
    prefix = shorten_label(type_label, DEVICE_TYPE_MAX) + "-"
    digits = name[len(prefix) :] if name.startswith(prefix) else ""
    if not digits.isascii() or not digits.isdigit() or (len(digits) > 1 and digits[0] == "0"):
        return None
    return int(digits)


def slice_name(zone_label: str, type_label: str, index: int) -> str:
    """`thunder.<zone>.<type>.<k>`: dots cannot occur inside labels, so no two pools'
    slice names collide, and the name never exceeds the 253-character limit."""
    return f"{SLICE_NAME_PREFIX}.{zone_label}.{type_label}.{index}"


def device_class_name(prefix: str, type_label: str) -> str:
    """DeviceClass `<prefix><type>`, e.g. thunder-gpu-a6000."""
    name = prefix + type_label
    if not syntax.is_dns_subdomain(name):
        raise ValueError(f'DeviceClass name "{name}" is not a DNS subdomain')
    return name


def extended_resource_name(prefix: str, type_label: str) -> str | None:
    """Extended resource `<prefix><type>`, or None when the prefix is empty.

    The part after '/' is limited to 63 characters, so a long model is shortened
    (with its hash) to fit; an invalid prefix raises ValueError.
    """
    if prefix == "":
        return None
    _, _, name_prefix = prefix.rpartition("/")
    room = syntax.QUALIFIED_NAME_MAX - len(name_prefix)
    if room <= _HASH_LENGTH:
        raise ValueError(f'extended resource prefix "{prefix}" leaves no room for the model')
    name = prefix + shorten_label(type_label, room)
    problem = syntax.extended_resource_name_problem(name)
    if problem is not None:
        raise ValueError(f'extended resource name "{name}" {problem}')
    return name


def is_extended_resource_name(value: str) -> bool:
    """Whether Kubernetes accepts `value` as a DeviceClass extendedResourceName."""
    return syntax.extended_resource_name_problem(value) is None


def cdi_device_id(claim_uid: str) -> str:
    """Fully qualified CDI device of a claim: thundercompute.com/gpu=claim-<uid>."""
    return f"{CDI_KIND}=claim-{claim_uid}"


def component_labels(component: str) -> dict[str, str]:
    """The labels every object of `component` carries."""
    return {LABEL_APP_NAME: APP_NAME, LABEL_COMPONENT: component}


def label_selector(labels: Mapping[str, str]) -> str:
    """`k=v,k2=v2` for list calls, keys sorted so the string is stable."""
    return ",".join(f"{key}={labels[key]}" for key in sorted(labels))
