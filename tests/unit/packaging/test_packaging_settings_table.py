"""README.md's settings table: every Helm value and ThunderCluster field, generated, not stale."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from release import settings_table
from tests.unit.packaging.chartkit import CHART, NAMESPACE, REPO, render
from thunder_dra.webhooks.validation import IMMUTABLE_WHILE_PUBLISHED


def _at(data: Any, path: str) -> Any:
    for part in path.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def test_the_readme_table_is_up_to_date() -> None:
    assert settings_table.main(["--check"]) == 0, "run make helm-docs"
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "use the same names" not in readme, "the Helm values and the ThunderCluster differ"
    assert "`kubectl edit` of a field the chart owns is undone by the next `helm upgrade`" in readme


def test_every_value_and_field_is_one_row() -> None:
    rows = settings_table.settings()
    values = settings_table.helm_values()
    fields = settings_table.cluster_fields()
    assert sorted(r.field for r in rows if r.field) == sorted(fields)
    named = [r.helm for r in rows if r.helm and r.helm != settings_table.RELEASE_NAMESPACE]
    assert sorted(set(named)) == sorted(values)
    assert len(named) == len(values)
    fixed = {r.field for r in rows if r.fixed}
    assert fixed == {".".join(p) for p in IMMUTABLE_WHILE_PUBLISHED}
    only_cluster = {r.field for r in rows if r.owner == "ThunderCluster"}
    assert {"operator.driverName", "thunder.installerSHA256"} <= only_cluster


def test_the_mapping_is_what_the_chart_renders() -> None:
    """Each row owned by Helm puts the value's default into its field; the others are unset."""
    spec = render().one("ThunderCluster")["spec"]
    defaults = json.loads(json.dumps(settings_table.helm_values()))
    for row in settings_table.settings():
        if not row.field:
            continue
        if row.owner == "ThunderCluster":
            assert _at(spec, row.field) is None, row.field
        elif row.helm == settings_table.RELEASE_NAMESPACE:
            assert _at(spec, row.field) == NAMESPACE
        else:
            assert _at(spec, row.field) == defaults[row.helm], row.field


def test_a_changed_default_makes_the_table_stale(tmp_path: Path) -> None:
    chart = tmp_path / CHART.name
    shutil.copytree(CHART, chart)
    crd = tmp_path / settings_table.CRD.name
    shutil.copy(settings_table.CRD, crd)
    readme = tmp_path / "README.md"
    shutil.copy(REPO / "README.md", readme)
    args = ["--check", "--readme", str(readme), "--chart", str(chart), "--crd", str(crd)]
    assert settings_table.main(args) == 0

    values = chart / "values.yaml"
    before = values.read_text()
    assert "reconcileInterval: 60s\n" in before
    values.write_text(before.replace("reconcileInterval: 60s\n", "reconcileInterval: 90s\n"))
    assert settings_table.main(args) == 1
    values.write_text(before)

    text = crd.read_text()
    assert "default: 50\n" in text  # inventoryProtection.maxShrinkPercent
    crd.write_text(text.replace("default: 50\n", "default: 40\n", 1))
    assert settings_table.main(args) == 1
