"""Strict skips (tests/support/skips.py): which skips fail a `make test` run, and how it says so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import skips

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """
from pathlib import Path
from tests.support import skips

def pytest_configure(config):
    source = Path(__file__).parent / "expected-skips.txt"
    config.pluginmanager.register(skips.StrictSkips(source, skips.load(source)))
"""

TESTS = """
import pytest

def test_runs():
    pass

def test_needs_a_gpu():
    pytest.skip("no GPU on this machine")

@pytest.mark.parametrize("version", ["1.37", "1.34"])
def test_versioned(version):
    if version == "1.34":
        pytest.skip("alpha in 1.34")

@pytest.mark.xfail(reason="a known bug")
def test_known_bug():
    assert False
"""

ONE = "test_cases.py::test_versioned[1.34]  alpha in 1.34\n"


def _run(tmp_path: Path, expected: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_cases.py").write_text(TESTS)
    (tmp_path / "expected-skips.txt").write_text(expected)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(skips.ENV, None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_skip_not_on_the_list_fails_the_run_naming_the_test_and_its_reason(
    tmp_path: Path,
) -> None:
    run = _run(tmp_path, ONE)
    assert run.returncode == 1, run.stdout
    assert "unexpected skip: test_cases.py::test_needs_a_gpu: no GPU on this machine" in run.stdout
    assert "test_versioned[1.34]" not in run.stdout.split("strict skips")[1]
    assert "1 xfailed" in run.stdout  # an expected failure is not a skip


def test_skips_on_the_list_pass(tmp_path: Path) -> None:
    run = _run(tmp_path, ONE + "test_cases.py::test_needs_a_*  no GPU\n")
    assert run.returncode == 0, run.stdout
    assert "strict skips" not in run.stdout


def test_a_listed_test_that_skips_for_another_reason_is_unexpected(tmp_path: Path) -> None:
    run = _run(tmp_path, ONE + "test_cases.py::test_needs_a_gpu  Go toolchain not found\n")
    assert run.returncode == 1, run.stdout
    assert "unexpected skip: test_cases.py::test_needs_a_gpu: no GPU on this machine" in run.stdout


def test_an_entry_whose_test_now_runs_fails_the_run(tmp_path: Path) -> None:
    run = _run(tmp_path, ONE + "test_cases.py::test_runs  no GPU\n", "-k", "runs or 1.34")
    assert run.returncode == 1, run.stdout
    assert "line 2: test_cases.py::test_runs  no GPU: its tests ran and none skipped" in run.stdout


def test_a_failing_run_stays_failed_and_still_lists_the_skips(tmp_path: Path) -> None:
    (tmp_path / "test_more.py").write_text("def test_fails():\n    assert False\n")
    run = _run(tmp_path, ONE)
    assert run.returncode == 1, run.stdout
    assert "1 failed" in run.stdout
    assert "unexpected skip: test_cases.py::test_needs_a_gpu" in run.stdout


def test_an_entry_naming_no_test_is_dead_only_in_a_whole_suite_run() -> None:
    entries = [
        skips.ExpectedSkip("t.py::test_gone", "reason", 3),
        skips.ExpectedSkip("t.py::test_a[1.34]", "alpha", 4),
    ]
    ran = ["t.py::test_a[1.37]", "t.py::test_a[1.34]"]
    skipped = {"t.py::test_a[1.34]": "alpha in 1.34"}
    whole = skips.judge(entries, skipped, ran, whole_suite=True)
    assert (whole.unexpected, whole.stale, whole.dead) == ([], [], [entries[0]])
    narrow = skips.judge(entries, skipped, ran, whole_suite=False)
    assert not narrow


def test_brackets_are_literal_and_a_star_matches_anything() -> None:
    entry = skips.ExpectedSkip("tests/a/test_x.py::test_y[1*]", "r", 1)
    assert entry.names("tests/a/test_x.py::test_y[1.34]")
    assert not entry.names("tests/a/test_x.py::test_y1")
    assert not entry.names("tests/a/test_x.py::test_y[2.0]")


def test_a_line_without_a_reason_is_refused_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "expected-skips.txt"
    path.write_text("# comment\n\ntests/test_x.py::test_y\n")
    with pytest.raises(skips.ExpectedSkipsError, match=r"expected-skips.txt:3: "):
        skips.load(path)


def test_the_repositorys_list_loads_and_names_tests_that_exist() -> None:
    entries = skips.load(REPO / "tests" / "expected-skips.txt")
    assert entries
    for entry in entries:
        module = REPO / entry.pattern.split("::")[0]
        assert module.is_file(), entry
        function = entry.pattern.split("::")[1].split("[")[0]
        assert f"def {function}(" in module.read_text(), entry
