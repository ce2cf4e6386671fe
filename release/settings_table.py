# Generates the settings table in README.md (between the settings-table markers): every
# Helm value and every ThunderCluster field, which one owns it, and whether it can change
# once the operator has published.
#
#   .venv/bin/python -m release.settings_table            # rewrite the table in README.md
#   .venv/bin/python -m release.settings_table --check    # exit 1 if the table is stale
"""README settings table: the chart's values, the ThunderCluster CRD, and how they meet.

Sources, all read as they are committed:

- the Helm values: the leaves of ``values.schema.json`` (objects with declared
  properties are walked into), with their defaults from ``values.yaml``;
- the ThunderCluster fields: the leaves of the ``spec`` schema in the CRD ``crds/``
  holds (generated from ``thunder_dra/api/thundercluster.py``), with their defaults;
- which value fills which field: the chart's ``templates/thundercluster.yaml``, read
  line by line (``field: {{ .Values.a.b }}``, a ``$var := .Values.x`` alias, a ``toYaml``
  on the next line, ``.Release.Namespace``);
- what cannot change once published: ``IMMUTABLE_WHILE_PUBLISHED`` in
  ``thunder_dra/webhooks/validation.py``, the fields the webhook refuses to change while
  ResourceSlices or DeviceClasses are published.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from thunder_dra.webhooks.validation import IMMUTABLE_WHILE_PUBLISHED

REPO: Final = Path(__file__).resolve().parents[1]
CHART: Final = REPO / "charts" / "thunder-device-plugin"
CRD: Final = REPO / "crds" / "thunderclusters.thundercompute.com.yaml"
TEMPLATE: Final = CHART / "templates" / "thundercluster.yaml"
README: Final = REPO / "README.md"
START: Final = "<!-- settings-table:start -->"
END: Final = "<!-- settings-table:end -->"
RELEASE_NAMESPACE: Final = "the release namespace"
"""The Helm column of a field the chart fills with the namespace it is installed in."""

_FIELD = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z0-9_]+):\s*(?P<rest>.*)$")
_ALIAS = re.compile(r"\{\{-?\s*\$(?P<var>\w+)\s*:=\s*\.Values\.(?P<path>[\w.]+)\s*-?\}\}")
_VALUE = re.compile(r"(?:\.Values\.(?P<path>[\w.]+)|\$(?P<var>\w+)\.(?P<sub>[\w.]+))")


class SettingsError(RuntimeError):
    """The template maps a value or a field that the schema or the CRD does not have."""


@dataclass(frozen=True, slots=True)
class Setting:
    helm: str
    field: str
    owner: str
    default: str
    fixed: bool


def _leaves(schema: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, sub in schema.get("properties", {}).items():
        key = f"{prefix}.{name}" if prefix else name
        if sub.get("type") == "object" and "properties" in sub:
            yield from _leaves(sub, key)
        else:
            yield key, sub


def _lookup(values: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(values, Mapping):
            return None
        values = values.get(part)
    return values


def helm_values(chart: Path = CHART) -> dict[str, Any]:
    """Every Helm value's path and its default in ``values.yaml`` (None: not set there)."""
    schema = json.loads((chart / "values.schema.json").read_text())
    values = yaml.safe_load((chart / "values.yaml").read_text()) or {}
    return {key: _lookup(values, key) for key, _ in _leaves(schema)}


def cluster_fields(crd: Path = CRD) -> dict[str, Any]:
    """Every ThunderCluster ``spec`` field's path and its CRD default (None: none)."""
    doc = yaml.safe_load(crd.read_text())
    (version,) = [v for v in doc["spec"]["versions"] if v.get("storage")]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return {key: sub.get("default") for key, sub in _leaves(spec)}


def template_mapping(template: Path = TEMPLATE) -> dict[str, str]:
    """ThunderCluster field path -> the Helm value path (or RELEASE_NAMESPACE) filling it."""
    lines = template.read_text().splitlines()
    aliases = {m["var"]: m["path"] for line in lines for m in _ALIAS.finditer(line)}
    mapping: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    in_spec = False
    for index, line in enumerate(lines):
        if line.startswith("spec:"):
            in_spec = True
            continue
        if not in_spec:
            continue
        found = _FIELD.match(line)
        if found is None:
            continue
        indent = len(found["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, found["key"]))
        rest = found["rest"]
        if not rest and index + 1 < len(lines) and "toYaml" in lines[index + 1]:
            rest = lines[index + 1]
        if not rest:
            continue
        path = ".".join(key for _, key in stack)
        if ".Release.Namespace" in rest:
            mapping[path] = RELEASE_NAMESPACE
            continue
        value = _VALUE.search(rest)
        if value is None:
            raise SettingsError(f"{template}: spec.{path} is filled from no value: {rest}")
        if value["path"]:
            mapping[path] = value["path"]
        else:
            if value["var"] not in aliases:
                raise SettingsError(f"{template}: ${value['var']} is not a .Values alias")
            mapping[path] = f"{aliases[value['var']]}.{value['sub']}"
    return mapping


def _expanded(mapping: Mapping[str, str], fields: Mapping[str, Any]) -> dict[str, str]:
    """A whole object copied in (``toYaml``) maps each of its leaves to the same leaf."""
    out: dict[str, str] = {}
    for field, value in mapping.items():
        inner = [f for f in fields if f.startswith(field + ".")]
        if field in fields or not inner or value == RELEASE_NAMESPACE:
            out[field] = value
            continue
        for leaf in inner:
            out[leaf] = value + leaf[len(field) :]
    return out


def _default(value: Any) -> str:
    if value is None:
        return ""
    return f"`{json.dumps(value, separators=(', ', ': '))}`".replace("|", "\\|")


def settings(chart: Path = CHART, crd: Path = CRD) -> list[Setting]:
    template = chart / TEMPLATE.relative_to(CHART)
    values = helm_values(chart)
    fields = cluster_fields(crd)
    mapping = _expanded(template_mapping(template), fields)
    fixed = {".".join(path) for path in IMMUTABLE_WHILE_PUBLISHED}
    for field, value in mapping.items():
        if field not in fields:
            raise SettingsError(f"{template} sets spec.{field}, which the CRD does not have")
        if value != RELEASE_NAMESPACE and value not in values:
            raise SettingsError(f"{template} reads {value}, which values.schema.json lacks")
    missing = fixed - set(fields)
    if missing:
        raise SettingsError(f"fixed fields the CRD does not have: {sorted(missing)}")
    out: list[Setting] = []
    for field, crd_default in fields.items():
        helm = mapping.get(field)
        if helm is None:
            out.append(Setting("", field, "ThunderCluster", _default(crd_default), field in fixed))
        elif helm == RELEASE_NAMESPACE:
            out.append(Setting(helm, field, "Helm", "", field in fixed))
        else:
            out.append(Setting(helm, field, "Helm", _default(values[helm]), field in fixed))
    rendered = set(mapping.values())
    for helm, default in values.items():
        if helm not in rendered:
            out.append(Setting(helm, "", "Helm", _default(default), False))
    return out


def table(rows: list[Setting]) -> str:
    lines = [
        "| Helm value | ThunderCluster field | owned by | default | fixed once published |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        helm = row.helm if row.helm == RELEASE_NAMESPACE else (f"`{row.helm}`" if row.helm else "")
        field = f"`spec.{row.field}`" if row.field else ""
        fixed = "yes" if row.fixed else ""
        lines.append(f"| {helm} | {field} | {row.owner} | {row.default} | {fixed} |")
    return "\n".join(lines) + "\n"


def replace(readme: str, generated: str) -> str:
    if readme.count(START) != 1 or readme.count(END) != 1:
        raise SettingsError(f"README.md needs one {START} and one {END}")
    head, rest = readme.split(START)
    _, tail = rest.split(END)
    return f"{head}{START}\n{generated}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--chart", type=Path, default=CHART)
    parser.add_argument("--crd", type=Path, default=CRD, help="the ThunderCluster CRD")
    parser.add_argument("--check", action="store_true", help="fail if the table is stale")
    args = parser.parse_args(argv)
    readme: Path = args.readme
    current = readme.read_text()
    try:
        wanted = replace(current, table(settings(args.chart, args.crd)))
    except SettingsError as err:
        print(err, file=sys.stderr)
        return 1
    if args.check:
        if current != wanted:
            print(
                f"the settings table in {readme} is out of date with values.schema.json, "
                "values.yaml, the ThunderCluster CRD or templates/thundercluster.yaml: "
                "run `make helm-docs`",
                file=sys.stderr,
            )
            return 1
        print(f"the settings table in {readme} is up to date")
        return 0
    if current != wanted:
        readme.write_text(wanted)
    print(f"wrote the settings table in {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
