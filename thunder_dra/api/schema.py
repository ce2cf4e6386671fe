"""Turn a pydantic model's JSON Schema into a structural OpenAPI v3 schema for a CRD.

Kubernetes accepts only structural schemas: every node typed, no `$ref`, `anyOf`
only for value validations (or the int-or-string shape), `nullable` instead of a
`null` type, OpenAPI 3.0 keywords. Anything this converter does not recognise is an
error, so a model change that cannot be expressed fails generation instead of
producing a schema the API server would reject.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pydantic import BaseModel

_REF_PREFIX: Final = "#/$defs/"

# Order of keys in the output, so the YAML reads top-down and diffs stay small.
_KEY_ORDER: Final = (
    "description",
    "type",
    "format",
    "enum",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minItems",
    "maxItems",
    "maxProperties",
    "default",
    "nullable",
    "anyOf",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations",
    "required",
    "properties",
    "additionalProperties",
    "items",
)
_ALLOWED: Final = frozenset(_KEY_ORDER)
_DROPPED: Final = frozenset({"title"})


class SchemaError(ValueError):
    """The model uses a construct that has no structural OpenAPI v3 form."""


def structural_schema(
    model: type[BaseModel], *, defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of `model`.

    `defaults`, when given, is a fully defaulted instance of the model dumped to JSON;
    it supplies the defaults pydantic cannot put in a JSON Schema (default factories)
    and turns every all-optional nested object into `default: {}` so the API server
    fills its fields in too. Without it, only plain (non-null) defaults are kept.
    """
    raw = model.model_json_schema(by_alias=True, mode="validation")
    definitions = raw.pop("$defs", {})
    schema = _convert(raw, definitions, path=model.__name__)
    if defaults is not None:
        _overlay_defaults(schema, defaults)
    return schema


def strip_defaults(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of `schema` without any `default` (used for status, which the operator owns)."""
    result = {key: value for key, value in schema.items() if key != "default"}
    if "properties" in result:
        result["properties"] = {k: strip_defaults(v) for k, v in result["properties"].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(result.get(key), dict):
            result[key] = strip_defaults(result[key])
    return result


def _convert(node: Mapping[str, Any], definitions: Mapping[str, Any], path: str) -> dict[str, Any]:
    node = dict(node)
    if "$ref" in node:
        ref = node.pop("$ref")
        if not ref.startswith(_REF_PREFIX) or ref[len(_REF_PREFIX) :] not in definitions:
            raise SchemaError(f"{path}: unresolvable reference {ref}")
        target = _convert(definitions[ref[len(_REF_PREFIX) :]], definitions, path)
        # The referencing field's own keywords (description, default) win over the model's.
        node = {**target, **node}
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        node = _collapse_nullable(node, definitions, path)
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if "exclusiveMinimum" in node and not isinstance(node["exclusiveMinimum"], bool):
        node["minimum"], node["exclusiveMinimum"] = node["exclusiveMinimum"], True
    if "exclusiveMaximum" in node and not isinstance(node["exclusiveMaximum"], bool):
        node["maximum"], node["exclusiveMaximum"] = node["exclusiveMaximum"], True
    if node.get("additionalProperties") is False:
        # Structural schemas forbid `false`; unknown fields are pruned anyway.
        del node["additionalProperties"]
    if node.get("default", 0) is None:
        del node["default"]
    if "properties" in node:
        node["properties"] = {
            name: _convert(child, definitions, f"{path}.{name}")
            for name, child in node["properties"].items()
        }
        if node.get("type") is None:
            node["type"] = "object"
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            node[key] = _convert(node[key], definitions, f"{path}[]")
    if "description" in node:
        node["description"] = " ".join(str(node["description"]).split())
    for key in _DROPPED:
        node.pop(key, None)
    unknown = set(node) - _ALLOWED
    if unknown:
        raise SchemaError(f"{path}: keywords {sorted(unknown)} have no structural form")
    if "type" not in node and not node.get("x-kubernetes-int-or-string"):
        raise SchemaError(f"{path}: no type")
    return {key: node[key] for key in _KEY_ORDER if key in node}


def _collapse_nullable(
    node: dict[str, Any], definitions: Mapping[str, Any], path: str
) -> dict[str, Any]:
    options = node.pop("anyOf")
    non_null = [option for option in options if option != {"type": "null"}]
    if len(non_null) != 1 or len(options) != 2:
        raise SchemaError(f"{path}: only `X | None` unions have a structural form")
    inner = _convert(non_null[0], definitions, path)
    return {**inner, **node, "nullable": True}


def _overlay_defaults(schema: dict[str, Any], defaults: Mapping[str, Any]) -> None:
    properties: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", ()))
    for name, child in properties.items():
        if name in required or name not in defaults:
            child.pop("default", None)
            continue
        value = defaults[name]
        nested = child.get("type") == "object" and "properties" in child
        if nested and isinstance(value, Mapping) and not child.get("required"):
            # `{}` lets the API server default each field; that only validates when the
            # object has no required fields.
            _overlay_defaults(child, value)
            child["default"] = {}
        else:
            child["default"] = value
        properties[name] = {key: child[key] for key in _KEY_ORDER if key in child}
