"""Generate docs/configuration.md, the settings reference, from the CRD schemas.

    python -m thunder_dra.api.docgen [--out docs/configuration.md]
    python -m thunder_dra.api.docgen --check   # exit 1 if the file drifted

It reads the same schemas crdgen writes, so the reference states exactly what the
API server enforces: types, defaults, enums and bounds, with the models' field docs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from thunder_dra.api.constants import API_VERSION
from thunder_dra.api.crdgen import CLIENT_CRD, THUNDER_CLUSTER_CRD, CrdDefinition, openapi_schema
from thunder_dra.api.duration import DURATION_PATTERN
from thunder_dra.api.thundercluster import ThunderClusterSpec

DEFAULT_OUT: Final = Path("docs/configuration.md")

_INTRO: Final = """\
# Configuration reference

<!-- Generated from thunder_dra/api by `python -m thunder_dra.api.docgen`. Do not edit. -->

Every runtime setting of the driver lives in the cluster's one `ThunderCluster`
resource (`thunderclusters.thundercompute.com`, cluster-scoped). Field paths mirror
the Helm chart's values: `spec.thunder.apiURL` here is `thunder.apiURL` there. The
Thunder API token is never a field; it is read from the Secret named by
`spec.thunder.secretName`. Every field has a default, so an empty spec is valid, and
the API server fills the defaults in when the object is stored.

Durations are Go-style strings: a number and a unit (`ns`, `us`, `ms`, `s`, `m`,
`h`), combinable, as in `60s`, `5m` or `1h30m`.
"""


def _type_of(schema: Mapping[str, Any]) -> str:
    if schema.get("x-kubernetes-int-or-string"):
        return "quantity"
    if "enum" in schema:
        return "one of " + ", ".join(f"`{value}`" for value in schema["enum"])
    kind = schema.get("type", "object")
    if kind == "string" and schema.get("pattern") == DURATION_PATTERN:
        return "duration"
    if kind == "string" and schema.get("format") == "date-time":
        return "time"
    if kind == "array":
        return f"list of {_type_of(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema:
        return f"map of {_type_of(schema['additionalProperties'])}"
    return str(kind)


def _bounds(schema: Mapping[str, Any]) -> str:
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None and high is not None:
        return f" Range: {low} to {high}."
    if low is not None:
        return f" At least {low}."
    if high is not None:
        return f" At most {high}."
    return ""


def _default(schema: Mapping[str, Any]) -> str:
    if "default" not in schema or (schema.get("type") == "object" and "properties" in schema):
        return ""
    return f"`{json.dumps(schema['default'], separators=(', ', ': '))}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(schema: Mapping[str, Any], path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(path, schema) of every leaf under `schema`, depth first; list items as `[]`."""
    for name, child in schema.get("properties", {}).items():
        child_path = f"{path}.{name}"
        if child.get("type") == "object" and "properties" in child:
            yield from _rows(child, child_path)
            continue
        yield child_path, child
        items = child.get("items", {})
        if child.get("type") == "array" and "properties" in items:
            yield from _rows(items, child_path + "[]")


def _table(schema: Mapping[str, Any], path: str, *, with_defaults: bool) -> list[str]:
    header = (
        "| Field | Type | Default | Description |"
        if with_defaults
        else "| Field | Type | Description |"
    )
    lines = [header, "|---|---|---|---|" if with_defaults else "|---|---|---|"]
    for row_path, row in _rows(schema, path):
        described = _cell(row.get("description", "") + _bounds(row))
        cells = [f"`{row_path}`", _cell(_type_of(row))]
        if with_defaults:
            cells.append(_default(row))
        cells.append(described)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _sections(spec: Mapping[str, Any]) -> list[str]:
    lines: list[str] = []
    for name, section in spec["properties"].items():
        lines += ["", f"### spec.{name}", "", section.get("description", ""), ""]
        lines += _table(section, f"spec.{name}", with_defaults=True)
    return lines


def _example() -> list[str]:
    document = {
        "apiVersion": API_VERSION,
        "kind": "ThunderCluster",
        "metadata": {"name": "thunder"},
        "spec": ThunderClusterSpec().to_json_dict(),
    }
    text = yaml.safe_dump(document, sort_keys=False, default_flow_style=False, width=100)
    return ["", "### Example: every default spelled out", "", "```yaml", text.rstrip(), "```"]


def _resource(definition: CrdDefinition, title: str) -> list[str]:
    root = openapi_schema(definition)
    spec, status = root["properties"]["spec"], root["properties"]["status"]
    lines = ["", f"## {title}", "", definition.description]
    if definition.spec_required:
        lines += ["", "### spec", "", spec.get("description", ""), ""]
        lines += _table(spec, "spec", with_defaults=True)
    else:
        lines += _sections(spec)
        lines += _example()
    lines += ["", "### status", "", status.get("description", ""), ""]
    lines += _table(status, "status", with_defaults=False)
    return lines


def render() -> str:
    """The whole of docs/configuration.md."""
    lines = [_INTRO.rstrip()]
    lines += _resource(THUNDER_CLUSTER_CRD, "ThunderCluster")
    lines += _resource(CLIENT_CRD, "Client")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m thunder_dra.api.docgen", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output file")
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not args.out.is_file() or args.out.read_text(encoding="utf-8") != text:
            print(
                f"{args.out} is out of date with thunder_dra/api; "
                "regenerate with: python -m thunder_dra.api.docgen",
                file=sys.stderr,
            )
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
