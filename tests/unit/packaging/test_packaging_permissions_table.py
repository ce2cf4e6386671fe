"""The chart README's permissions table is the chart's rendered RBAC, and fails when stale."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from release import helm_docs, permissions_table
from tests.unit.packaging.chartkit import CHART, REPO, render
from thunder_dra.kube.admissionpolicy import SUFFIXES


@pytest.fixture(scope="module")
def rendered() -> str:
    return permissions_table.render_chart(CHART)


def test_the_chart_readme_holds_the_generated_permissions(rendered: str) -> None:
    readme = (CHART / "README.md").read_text()
    assert permissions_table.section(CHART, rendered).rstrip() in readme, "run make helm-docs"
    assert helm_docs.main(["--check"]) == 0, "run make helm-docs"


def test_every_rule_of_every_role_is_a_row(rendered: str) -> None:
    roles = [o for o in render().objects if o["kind"] in ("Role", "ClusterRole")]
    wanted = sorted(
        (tuple(r["resources"]), tuple(r["verbs"])) for role in roles for r in role["rules"]
    )
    rows = permissions_table.rules(rendered)
    assert sorted((r.resources, r.verbs) for r in rows) == wanted
    assert {r.who for r in rows} == {"operator", "daemon", "test", "pre-delete"}


def test_the_daemon_writes_setup_secrets_and_reads_none(rendered: str) -> None:
    rows = permissions_table.rules(rendered)
    (daemon,) = [r for r in rows if r.who == "daemon" and "secrets" in r.resources]
    assert not {"get", "list", "watch"} & set(daemon.verbs)
    (operator,) = [r for r in rows if r.who == "operator" and "secrets" in r.resources]
    assert operator.verbs == ("get",)
    assert operator.names == ("<thunder.secretName>",)
    readme = (CHART / "README.md").read_text()
    assert "-daemon-setup-secrets` |" in readme, "the daemon's Secret rule names its policy"


def test_every_admission_policy_is_listed_with_whom_it_holds(rendered: str) -> None:
    found = {p.name.split("<namespace>-", 1)[1]: p for p in permissions_table.policies(rendered)}
    assert sorted(found) == sorted(SUFFIXES)
    assert found["daemon-setup-secrets"].daemon
    assert not found["daemon-setup-secrets"].others
    assert found["daemon-clients"].daemon
    assert not found["daemon-clients"].others
    assert found["client-writers"].others
    assert not found["client-writers"].daemon
    one_model = found["one-model-per-claim"]
    assert not one_model.daemon
    assert not one_model.others
    assert len(one_model.everyone) == 2
    assert one_model.resources == ("resourceclaims", "resourceclaimtemplates", "pods")
    assert one_model.operations == ("CREATE",)


def test_operator_md_points_at_the_one_table() -> None:
    text = (REPO / "docs" / "operator.md").read_text()
    assert "charts/thunder-device-plugin/README.md#permissions" in text
    assert "| who | may | why |" not in text


def test_a_changed_role_makes_the_readme_stale(tmp_path: Path) -> None:
    chart = tmp_path / CHART.name
    shutil.copytree(CHART, chart)
    assert helm_docs.main(["--check", "--chart", str(chart)]) == 0
    rbac = chart / "templates" / "rbac-daemon.yaml"
    text = rbac.read_text()
    before = "    resources: [nodes, pods]\n    verbs: [get]\n"
    assert before in text
    rbac.write_text(text.replace(before, "    resources: [nodes, pods]\n    verbs: [get, list]\n"))
    assert helm_docs.main(["--check", "--chart", str(chart)]) == 1
