# Generates the chart README (the full values reference) from README.tmpl.md,
# values.yaml, values.schema.json and the values files in examples/, and its permissions
# table from the chart's rendered RBAC and admission policies (release/permissions_table.py).
#
#   .venv/bin/python -m release.helm_docs            # write charts/<chart>/README.md
#   .venv/bin/python -m release.helm_docs --check    # exit 1 if README.md is out of date
#   .venv/bin/python -m release.helm_docs --chart charts/tests/pod
"""Chart README generation: one table per top-level value, from the schema and defaults."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from release import permissions_table

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CHART = REPO / "charts" / "thunder-device-plugin"
TEMPLATE = "README.tmpl.md"


@dataclass(frozen=True, slots=True)
class Row:
    key: str
    type: str
    default: str
    description: str


def _type_of(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if kind == "object" and "properties" not in schema:
        return "map"
    if kind == "array":
        items = schema.get("items", {})
        return f"list of {items.get('type', 'any')}"
    if isinstance(kind, list):
        return " or ".join(str(k) for k in kind)
    if kind is None and "anyOf" in schema:
        return " or ".join(str(s.get("type")) for s in schema["anyOf"])
    return str(kind or "any")


def _default(value: Any) -> str:
    if value is None:
        return ""
    text = json.dumps(value, separators=(", ", ": "))
    return f"`{text}`".replace("|", "\\|")


def _constraints(schema: Mapping[str, Any]) -> str:
    parts: list[str] = []
    if "enum" in schema:
        parts.append("One of " + ", ".join(f"`{json.dumps(v)}`" for v in schema["enum"]) + ".")
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None and high is not None:
        parts.append(f"From {low} to {high}.")
    elif low is not None:
        parts.append(f"At least {low}.")
    return " ".join(parts)


def _describe(schema: Mapping[str, Any]) -> str:
    text = str(schema.get("description", "")).strip()
    extra = _constraints(schema)
    joined = f"{text} {extra}".strip()
    return joined.replace("|", "\\|").replace("\n", " ")


def rows(schema: Mapping[str, Any], values: Any, prefix: str) -> Iterator[Row]:
    """Leaf values under ``prefix``: objects with declared properties are walked into."""
    props: Mapping[str, Any] = schema.get("properties", {})
    for name, sub in props.items():
        key = f"{prefix}.{name}" if prefix else name
        default = values.get(name) if isinstance(values, Mapping) else None
        if sub.get("type") == "object" and "properties" in sub:
            yield from rows(sub, default or {}, key)
            continue
        yield Row(key, _type_of(sub), _default(default), _describe(sub))


def values_section(schema: Mapping[str, Any], values: Mapping[str, Any]) -> str:
    out: list[str] = []
    loose: list[Row] = []
    for name, sub in schema.get("properties", {}).items():
        if sub.get("type") == "object" and "properties" in sub:
            out.append(f"### `{name}`\n")
            if sub.get("description"):
                out.append(str(sub["description"]).strip() + "\n")
            out.append(_table(list(rows(sub, values.get(name, {}), name))))
        else:
            loose.append(Row(name, _type_of(sub), _default(values.get(name)), _describe(sub)))
    if loose:
        out.append("### Other values\n")
        out.append(_table(loose))
    return "\n".join(out).rstrip() + "\n"


def _table(items: list[Row]) -> str:
    lines = ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    lines += [f"| `{r.key}` | {r.type} | {r.default} | {r.description} |" for r in items]
    return "\n".join(lines) + "\n"


def examples_section(chart: Path) -> str:
    folder = chart / "examples"
    if not folder.is_dir():
        return "(none)\n"
    lines = []
    for path in sorted(folder.glob("*.yaml")):
        summary = []
        for line in path.read_text().splitlines():
            text = line.lstrip("#").strip()
            if not line.startswith("#") or not text:
                break  # the summary is the first comment paragraph
            summary.append(text)
        text = " ".join(s for s in summary if s) or "(no description)"
        lines.append(f"- `examples/{path.name}`: {text}")
    return "\n".join(lines) + "\n"


def render(chart: Path) -> str:
    template = (chart / TEMPLATE).read_text()
    schema = json.loads((chart / "values.schema.json").read_text())
    values = yaml.safe_load((chart / "values.yaml").read_text()) or {}
    text = template.replace("{{ values }}", values_section(schema, values).rstrip())
    text = text.replace("{{ examples }}", examples_section(chart).rstrip())
    if "{{ permissions }}" in text:
        text = text.replace("{{ permissions }}", permissions_table.section(chart).rstrip())
    return text.rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chart", type=Path, default=DEFAULT_CHART)
    parser.add_argument("--check", action="store_true", help="fail if README.md is stale")
    args = parser.parse_args(argv)
    chart: Path = args.chart
    try:
        wanted = render(chart)
    except permissions_table.PermissionsError as err:
        print(err, file=sys.stderr)
        return 1
    readme = chart / "README.md"
    if args.check:
        if not readme.exists() or readme.read_text() != wanted:
            print(
                f"{readme} is out of date with values.yaml / values.schema.json / "
                f"{TEMPLATE} / the chart's RBAC and admission policies: run `make helm-docs`",
                file=sys.stderr,
            )
            return 1
        print(f"{readme} is up to date")
        return 0
    readme.write_text(wanted)
    print(f"wrote {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
