"""docs/install-names.md: every object's name in each install path, generated, not stale,
and no two paths naming one object apart without a reason."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from release import names_table
from release.names_table import PATHS, Row
from thunder_dra.controllers.process import options
from thunder_dra.controllers.workload import daemonset


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    return names_table.all_rows()


def test_the_table_is_up_to_date() -> None:
    assert names_table.main(["--check"]) == 0, "run .venv/bin/python -m release.names_table"


def test_every_difference_has_a_reason(rows: list[Row]) -> None:
    assert names_table.unexplained(rows) == []
    for row in rows:
        if row.differs:
            assert names_table.WHY[row.key] in names_table.table([row]).replace("\\<", "<")


def test_a_difference_without_a_reason_fails(rows: list[Row]) -> None:
    lease = next(r for r in rows if r.key == "lease")
    assert not lease.differs
    renamed = Row(lease.key, lease.what, {**lease.names, "code": "some-other-lease"})
    assert names_table.unexplained([renamed], {}) == [
        f"lease: {dict(renamed.names)} differ, WHY has no reason"
    ]
    assert names_table.unexplained([renamed], {"lease": "a reason"}) == []
    assert "a reason" in names_table.table([renamed], {"lease": "a reason"})
    # A reason left behind for names that agree again is stale.
    assert names_table.unexplained([lease], {"lease": "a reason"}) == [
        "lease: WHY gives a reason, the names agree"
    ]


def test_the_rows_name_what_each_path_installs(rows: list[Row]) -> None:
    by_key = {r.key: r for r in rows}
    expected = {
        "namespace",
        "operator-sa",
        "daemon-sa",
        "operator-clusterrole",
        "daemon-clusterrole",
        "deployment",
        "metrics-service",
        "webhook-service",
        "webhook-configuration",
        "webhook-secret",
        "lease",
        "thundercluster",
        "token-secret",
        "token-key",
        "admission-policies",
        "device-class-prefix",
        "driver",
        "label-name",
    }
    assert expected <= set(by_key)
    for key in ("namespace", "operator-sa", "daemon-sa", "lease", "admission-policies"):
        assert all(by_key[key].names[p] for p in PATHS), key
    # The operator's defaults are the kustomize and OLM names.
    for key in ("operator-sa", "daemon-sa", "lease", "admission-policies", "namespace"):
        names = by_key[key].names
        assert names["code"] == names["kustomize"] == names["olm"], key
    code = by_key["daemon-sa"].names["code"]
    assert code == options.DEFAULT_DAEMON_SERVICE_ACCOUNT
    assert by_key["lease"].names["code"] == options.DEFAULT_LEASE_NAME
    assert by_key["token-key"].names["code"] == daemonset.TOKEN_KEY


def test_every_daemon_set_the_operator_renders_is_a_row(rows: list[Row]) -> None:
    shown = {next(iter(r.names.values())) for r in rows if r.key.startswith("daemonset-")}
    constants = {
        value
        for name, value in vars(daemonset).items()
        if name.endswith("DAEMONSET_NAME") and isinstance(value, str)
    }
    assert constants
    assert shown == set(names_table.daemon_sets()) >= constants
    for row in rows:
        if row.key.startswith("daemonset-"):
            assert not row.differs


def test_a_renamed_object_makes_the_table_stale(tmp_path: Path) -> None:
    doc = tmp_path / "install-names.md"
    shutil.copy(names_table.DOC, doc)
    assert names_table.main(["--check", "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert "| `thunder-metrics` |" in text
    doc.write_text(text.replace("| `thunder-metrics` |", "| `thunder-operator-metrics` |", 1))
    assert names_table.main(["--check", "--doc", str(doc)]) == 1
    assert names_table.main(["--doc", str(doc)]) == 0
    assert doc.read_text() == names_table.DOC.read_text()
