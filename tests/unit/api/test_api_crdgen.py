"""The CRDs in crds/: in step with the models, structural, and defaulting like the models."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from thunder_dra.api import ClientSpec, ThunderClusterSpec
from thunder_dra.api.crdgen import (
    CLIENT_CRD,
    CRDS,
    THUNDER_CLUSTER_CRD,
    CrdDefinition,
    build_crd,
    drifted,
    main,
    openapi_schema,
)
from thunder_dra.api.schema import SchemaError, structural_schema

REPO = Path(__file__).resolve().parents[3]
CRD_DIR = REPO / "crds"

# Keywords a structural schema may use (apiextensions.k8s.io/v1 JSONSchemaProps that
# need no special handling), plus the Kubernetes extensions we emit.
_ALLOWED = {
    "description",
    "type",
    "format",
    "enum",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minItems",
    "maxItems",
    "maxProperties",
    "default",
    "nullable",
    "anyOf",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations",
}
_TYPES = {"object", "array", "string", "integer", "number", "boolean"}


def test_crds_in_the_repository_match_the_models() -> None:
    assert drifted(CRD_DIR) == [], "regenerate with: python -m thunder_dra.api.crdgen"


def test_check_mode_reports_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--out", str(tmp_path)]) == 0
    assert main(["--check", "--out", str(tmp_path)]) == 0
    victim = tmp_path / THUNDER_CLUSTER_CRD.file_name
    victim.write_text(victim.read_text().replace("60s", "30s"))
    assert main(["--check", "--out", str(tmp_path)]) == 1
    assert THUNDER_CLUSTER_CRD.file_name in capsys.readouterr().err


def test_files_are_the_documents_kubectl_applies() -> None:
    for definition in CRDS:
        document = yaml.safe_load((CRD_DIR / definition.file_name).read_text())
        assert document == build_crd(definition)
        assert document["metadata"]["name"] == f"{definition.plural}.thundercompute.com"
        version = document["spec"]["versions"][0]
        assert version["name"] == "v1alpha1"
        assert version["subresources"] == {"status": {}}


def _nodes(schema: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from _nodes(child, f"{path}.{name}")
    if isinstance(schema.get("items"), Mapping):
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), Mapping):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


def _problems(value: Any, schema: Mapping[str, Any], path: str) -> list[str]:
    """The validation the API server runs on a default (and on stored objects)."""
    if value is None:
        return [] if schema.get("nullable") else [f"{path}: null"]
    if schema.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, int) or (
            isinstance(value, str) and re.search(schema["pattern"], value) is not None
        )
        return [] if ok else [f"{path}: not int-or-string"]
    kind = schema["type"]
    problems = []
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path}: {value!r} not in enum")
    if kind == "string" and isinstance(value, str):
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            problems.append(f"{path}: {value!r} does not match {schema['pattern']}")
        if len(value) > schema.get("maxLength", len(value)):
            problems.append(f"{path}: too long")
    elif kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
        if not schema.get("minimum", value) <= value <= schema.get("maximum", value):
            problems.append(f"{path}: out of range")
    elif kind == "boolean" and isinstance(value, bool):
        pass
    elif kind == "array" and isinstance(value, list):
        for i, item in enumerate(value):
            problems += _problems(item, schema["items"], f"{path}[{i}]")
    elif kind == "object" and isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                problems.append(f"{path}.{key}: required")
        for key, item in value.items():
            child = schema.get("properties", {}).get(key, schema.get("additionalProperties"))
            if child is None:
                problems.append(f"{path}.{key}: unknown field")
            else:
                problems += _problems(item, child, f"{path}.{key}")
    else:
        problems.append(f"{path}: {value!r} is not {kind}")
    return problems


@pytest.mark.parametrize("definition", CRDS, ids=lambda d: d.kind)
def test_schemas_are_structural(definition: CrdDefinition) -> None:
    root = openapi_schema(definition)
    assert root["type"] == "object"
    assert root["properties"]["metadata"] == {"type": "object"}
    for path, node in _nodes(root):
        assert set(node) <= _ALLOWED, f"{path}: {set(node) - _ALLOWED}"
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, path
            assert node.get("anyOf") == [{"type": "integer"}, {"type": "string"}], path
            continue
        assert node.get("type") in _TYPES, f"{path}: no type"
        assert "anyOf" not in node, f"{path}: anyOf outside int-or-string"
        if node["type"] == "object":
            assert not ("properties" in node and "additionalProperties" in node), path
            assert set(node.get("required", ())) <= set(node.get("properties", {})), path
        if node["type"] == "array":
            assert isinstance(node.get("items"), Mapping), f"{path}: array without items"
            if node.get("x-kubernetes-list-type") == "map":
                items = node["items"]
                for key in node["x-kubernetes-list-map-keys"]:
                    assert key in items.get("required", ()) or "default" in items["properties"][key]
        if "default" in node:
            assert _problems(node["default"], node, path) == [], path
    # The API server forbids these anywhere in a structural schema.
    text = yaml.safe_dump(root)
    for forbidden in (
        "$ref",
        "$defs",
        "oneOf",
        "allOf",
        "definitions",
        "additionalProperties: false",
    ):
        assert forbidden not in text


def _apply_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """What the API server does with `default`s when it stores an object."""
    if not isinstance(value, dict):
        return value
    result = dict(value)
    for name, child in schema.get("properties", {}).items():
        if name not in result and "default" in child:
            result[name] = child["default"]
        if name in result:
            result[name] = _apply_defaults(child, result[name])
    return result


def test_api_server_defaulting_gives_the_models_defaults() -> None:
    spec_schema = openapi_schema(THUNDER_CLUSTER_CRD)["properties"]["spec"]
    assert spec_schema["default"] == {}
    stored = _apply_defaults(spec_schema, spec_schema["default"])
    assert stored == ThunderClusterSpec().to_json_dict()
    partial = _apply_defaults(spec_schema, {"daemon": {"image": {"tag": "v1"}}})
    assert ThunderClusterSpec.model_validate(partial).daemon.image.repository == (
        ThunderClusterSpec().daemon.image.repository
    )


def test_client_schema_requires_what_the_model_requires() -> None:
    root = openapi_schema(CLIENT_CRD)
    assert root["required"] == ["spec"]
    required = root["properties"]["spec"]["required"]
    model_required = [
        (info.alias or name) for name, info in ClientSpec.model_fields.items() if info.is_required()
    ]
    assert required == model_required


def test_status_schemas_carry_no_defaults() -> None:
    for definition in CRDS:
        status = openapi_schema(definition)["properties"]["status"]
        assert all("default" not in node for _, node in _nodes(status))


@pytest.mark.parametrize("definition", CRDS, ids=lambda d: d.kind)
def test_printer_columns_point_at_real_fields(definition: CrdDefinition) -> None:
    root = openapi_schema(definition)
    for column in definition.columns:
        parts = re.sub(r"\[\?.*?\]", "", column.json_path).strip(".").split(".")
        if parts[0] == "metadata":
            continue
        node: Mapping[str, Any] = root
        for part in parts:
            node = node["properties"][part] if "properties" in node else node["items"]
            if node.get("type") == "array":
                node = node["items"]
        assert node, column.name


def test_client_columns_make_a_useful_wide_listing() -> None:
    names = [c.name for c in CLIENT_CRD.columns if c.priority == 0]
    wide = [c.name for c in CLIENT_CRD.columns if c.priority == 1]
    assert names == ["Claim", "Node", "Zone", "Type", "Count", "Phase", "Age"]
    assert "Client ID" in wide


def test_unions_without_a_structural_form_are_refused() -> None:
    from pydantic import BaseModel

    class Bad(BaseModel):
        value: int | str | None = None

    with pytest.raises(SchemaError, match=r"only `X \| None`"):
        structural_schema(Bad)
