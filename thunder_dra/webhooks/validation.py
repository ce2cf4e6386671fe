"""Admission checks for ThunderCluster and Client, as pure functions.

Each returns every problem found, each with the path of the offending field, e.g.
`spec.operator.reconcileInterval: must be between 5s and 24h, got "0s"`, so a user
fixes an object in one round. Field rules live in the models (the operator applies
the same ones when it reads an object); this module adds the rules that need
context: the object it replaces, the other ThunderClusters, whether inventory is
already published.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ValidationError

from thunder_dra.api.client import ClientSpec
from thunder_dra.api.thundercluster import ThunderClusterSpec
from thunder_dra.kube import bodies

_Model = TypeVar("_Model", bound=BaseModel)

# Settings that name published objects: changing them would orphan every
# ResourceSlice and DeviceClass, and strand the claims allocated from them.
IMMUTABLE_WHILE_PUBLISHED: Final = (
    ("operator", "driverName"),
    ("operator", "extendedResourcePrefix"),
    ("operator", "deviceClassPrefix"),
)
CLIENT_IMMUTABLE: Final = ("claim", "nodeName", "zone", "gpuType", "gpuCount", "consumerKind")
CLIENT_SET_ONCE: Final = ("enrollmentTokenId", "consumerName")
"""May go from empty to a value (the daemon may record the Client before it knows
them), never change after."""


@dataclass(frozen=True, slots=True)
class FieldError:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def format_errors(errors: Sequence[FieldError]) -> str:
    """One message for an admission response: every error, `; `-separated."""
    return "; ".join(str(error) for error in errors)


def field_path(prefix: str, loc: Sequence[int | str]) -> str:
    """`spec` + (`daemon`, `tolerations`, 0, `key`) -> `spec.daemon.tolerations[0].key`."""
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.isidentifier():
            path += f".{part}"
        else:
            path += f"[{part}]"
    return path


def _parse(model: type[_Model], value: Any, prefix: str) -> tuple[_Model | None, list[FieldError]]:
    try:
        return model.model_validate(value if value is not None else {}), []
    except ValidationError as exc:
        return None, [
            FieldError(field_path(prefix, error["loc"]), error["msg"]) for error in exc.errors()
        ]


def _at(document: Mapping[str, Any], path: Sequence[str]) -> Any:
    value: Any = document
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _quoted(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


def validate_thundercluster(
    obj: Mapping[str, Any],
    *,
    old: Mapping[str, Any] | None = None,
    existing_names: Collection[str] = (),
    objects_published: bool = False,
) -> list[FieldError]:
    """Problems with a ThunderCluster being created (`old` None) or updated.

    `existing_names`: the ThunderClusters already stored; `objects_published`: whether
    the operator has published ResourceSlices or DeviceClasses.
    """
    # The spec as sent, not `bodies.spec`: one that is not a mapping must be rejected here,
    # not read as empty.
    spec, errors = _parse(ThunderClusterSpec, obj.get("spec"), "spec")
    name = _at(obj, ("metadata", "name"))
    if old is None:
        others = sorted(n for n in existing_names if n != name)
        if others:
            errors.append(
                FieldError(
                    "metadata.name",
                    "only one ThunderCluster may exist per cluster, "
                    f'and "{others[0]}" already does',
                )
            )
    if old is not None and objects_published and spec is not None:
        before = _effective_spec(old.get("spec"))
        after = spec.to_json_dict()
        for path in IMMUTABLE_WHILE_PUBLISHED:
            was, now = _at(before, path), _at(after, path)
            if was != now:
                errors.append(
                    FieldError(
                        "spec." + ".".join(path),
                        "is immutable once ResourceSlices or DeviceClasses are published, "
                        f"was {_quoted(was)}, got {_quoted(now)}",
                    )
                )
    return errors


def _effective_spec(raw: Any) -> dict[str, Any]:
    """The old spec with defaults filled in; raw values where it no longer validates."""
    spec, _ = _parse(ThunderClusterSpec, raw, "spec")
    if spec is not None:
        return spec.to_json_dict()
    defaults = ThunderClusterSpec().to_json_dict()
    merged = {section: dict(values) for section, values in defaults.items()}
    if isinstance(raw, Mapping):
        for section, values in raw.items():
            if isinstance(values, Mapping) and section in merged:
                merged[section].update(values)
    return merged


def validate_client(
    obj: Mapping[str, Any], *, old: Mapping[str, Any] | None = None
) -> list[FieldError]:
    """Problems with a Client being created (`old` None) or updated."""
    spec, errors = _parse(ClientSpec, obj.get("spec"), "spec")
    if old is None or spec is None:
        return errors
    before, _ = _parse(ClientSpec, old.get("spec"), "spec")
    was = before.to_json_dict() if before is not None else dict(bodies.spec(old))
    now = spec.to_json_dict()
    for key in CLIENT_IMMUTABLE:
        if was.get(key) != now.get(key):
            errors.append(FieldError(f"spec.{key}", f"is immutable, was {_quoted(was.get(key))}"))
    for key in CLIENT_SET_ONCE:
        if was.get(key) and was.get(key) != now.get(key):
            errors.append(
                FieldError(
                    f"spec.{key}",
                    f"may be set once and then never change, was {_quoted(was.get(key))}",
                )
            )
    return errors
