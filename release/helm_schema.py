# Checks that a chart's values.schema.json catches misspelled values: for every
# object the schema closes (additionalProperties: false), `helm template` with a
# misspelled key set must fail and name that key at that object (all probed in one
# render, any not named there again on its own). Also checks the schema is
# self-contained (no remote $ref, which Helm would fetch over the network).
#
#   .venv/bin/python -m release.helm_schema [--chart charts/thunder-device-plugin]
#       (make helm-schema)
"""A misspelled --set key must fail the install, naming the key."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from hack.cluster import binaries

REPO: Final = Path(__file__).resolve().parents[1]
CHARTS: Final = (
    REPO / "charts" / "thunder-device-plugin",
    REPO / "charts" / "tests" / "pod",
    REPO / "charts" / "tests" / "vm",
)


def closed_objects(
    schema: Mapping[str, Any], path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], list[str]]]:
    """Paths of objects that refuse unknown keys, with their known keys."""
    props: Mapping[str, Any] = schema.get("properties", {})
    if schema.get("type") == "object" and schema.get("additionalProperties") is False:
        yield path, list(props)
    for name, sub in props.items():
        yield from closed_objects(sub, (*path, name))


def remote_refs(schema: Any) -> list[str]:
    if isinstance(schema, Mapping):
        found = [str(v) for k, v in schema.items() if k == "$ref" and not str(v).startswith("#")]
        for value in schema.values():
            found += remote_refs(value)
        return found
    if isinstance(schema, list):
        return [ref for item in schema for ref in remote_refs(item)]
    return []


def misspell(key: str) -> str:
    """A plausible typo: swap two letters (or append one to a 1-letter key)."""
    if len(key) < 3:
        return key + "x"
    return key[0] + key[2] + key[1] + key[3:] if key[1] != key[2] else key + "x"


def _template(helm: str, chart: Path, keys: list[str]) -> subprocess.CompletedProcess[str]:
    sets = [arg for key in keys for arg in ("--set", f"{key}=1")]
    return subprocess.run(
        [helm, "template", "probe", str(chart), *sets], check=False, capture_output=True, text=True
    )


def check_chart(chart: Path) -> list[str]:
    schema = json.loads((chart / "values.schema.json").read_text())
    problems = [f"{chart.name}: remote $ref {ref}" for ref in remote_refs(schema)]
    helm = str(binaries() / "helm")
    probes = []
    for path, known in closed_objects(schema):
        probe = misspell(known[0]) if known else "unknownKey"
        while probe in known:
            probe += "x"
        probes.append((path, probe, ".".join((*path, probe))))
    # All probes in one render first: Helm lists every schema violation, each as
    # "at '<JSON pointer>': additional properties '<key>' not allowed". A probe whose own
    # line is there is refused at its own object; any other is tried on its own, as one
    # render per probe would.
    together = _template(helm, chart, [key for _, _, key in probes])
    for path, probe, key in probes:
        pointer = "".join(f"/{part}" for part in path)
        if f"at '{pointer}': additional properties '{probe}' not allowed" in together.stderr:
            continue
        done = _template(helm, chart, [key])
        if done.returncode == 0:
            problems.append(f"{chart.name}: --set {key}=1 was accepted")
        elif probe not in done.stderr:
            problems.append(f"{chart.name}: --set {key}=1 failed without naming {probe!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chart", type=Path, action="append", help="default: every chart")
    args = parser.parse_args(argv)
    charts: list[Path] = args.chart or list(CHARTS)
    problems = []
    for chart in charts:
        found = check_chart(chart)
        problems += found
        objects = len(list(closed_objects(json.loads((chart / "values.schema.json").read_text()))))
        status = "FAILED" if found else "ok"
        print(f"{chart.relative_to(REPO)}: a misspelled key in each of {objects} objects: {status}")
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
