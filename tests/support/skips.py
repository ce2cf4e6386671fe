"""Strict skips: a run fails when a test skips that `tests/expected-skips.txt` does not list.

A skip says "this cannot run here"; on the CI machine (root, cgroup v1, Python 3.11, no
GPU) almost everything can, so a skip there is a test that silently stopped testing.
`make test` sets ``THUNDER_STRICT_SKIPS=1`` and the root conftest then registers
`StrictSkips`, which fails the session when:

- a test (or a whole module, at collection) skipped and no entry of the list names it
  with a reason its skip message contains (an unexpected skip);
- an entry names tests that ran and none of them skipped (stale: the test runs here
  now, so the entry would hide a regression; remove it);
- in a run of the whole suite (pytest's ``testpaths``, no ``-k``, ``-m``,
  ``--deselect`` or ``--lf``), an entry names no test that ran (its test was renamed
  or removed). A narrower run cannot tell a dead entry from an unselected test, so it
  says nothing about entries it did not run.

The list's format: one entry a line, a pytest node id or a pattern in which ``*``
matches any run of characters (everything else, ``[`` and ``]`` included, is literal),
then whitespace, then text that the skip's reason must contain: so the entry says why
the test may skip, and a skip for another reason is still unexpected. Lines starting
with ``#`` and blank lines are comments.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pytest

ENV: Final = "THUNDER_STRICT_SKIPS"


class ExpectedSkipsError(ValueError):
    """The expected-skips file has a line that is not an entry."""


@dataclass(frozen=True)
class ExpectedSkip:
    pattern: str
    reason: str
    line: int

    def names(self, nodeid: str) -> bool:
        return _compiled(self.pattern).fullmatch(nodeid) is not None

    def allows(self, nodeid: str, message: str) -> bool:
        return self.names(nodeid) and self.reason in message

    def __str__(self) -> str:
        return f"line {self.line}: {self.pattern}  {self.reason}"


def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))


def load(path: Path) -> list[ExpectedSkip]:
    entries = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pattern, _, reason = line.partition(" ")
        reason = reason.strip()
        if ".py" not in pattern or not reason:
            raise ExpectedSkipsError(
                f"{path}:{number}: an entry is a node id or pattern (tests/...py::...), then "
                f"the text its skip reason contains; got {line!r}"
            )
        entries.append(ExpectedSkip(pattern, reason, number))
    return entries


@dataclass
class Verdict:
    unexpected: list[tuple[str, str]] = field(default_factory=list)
    """(node id, skip reason) of each skip no entry allows."""
    stale: list[ExpectedSkip] = field(default_factory=list)
    """Entries whose tests all ran without skipping."""
    dead: list[ExpectedSkip] = field(default_factory=list)
    """Entries that name no test of a whole-suite run."""

    def __bool__(self) -> bool:
        return bool(self.unexpected or self.stale or self.dead)

    def lines(self, source: Path) -> list[str]:
        out = []
        for nodeid, reason in self.unexpected:
            out.append(f"unexpected skip: {nodeid}: {reason}")
        for entry in self.stale:
            out.append(f"{source.name} {entry}: its tests ran and none skipped; remove it")
        for entry in self.dead:
            out.append(f"{source.name} {entry}: names no test of this run; fix or remove it")
        return out


def judge(
    expected: Iterable[ExpectedSkip],
    skipped: dict[str, str],
    ran: Iterable[str],
    *,
    whole_suite: bool,
) -> Verdict:
    """`skipped`: node id to skip reason; `ran`: every node id that reported (skipped too)."""
    entries = list(expected)
    ran = set(ran) | set(skipped)
    verdict = Verdict()
    for nodeid, reason in sorted(skipped.items()):
        if not any(entry.allows(nodeid, reason) for entry in entries):
            verdict.unexpected.append((nodeid, reason))
    for entry in entries:
        named = [nodeid for nodeid in ran if entry.names(nodeid)]
        if not named:
            if whole_suite:
                verdict.dead.append(entry)
        elif not any(nodeid in skipped for nodeid in named):
            verdict.stale.append(entry)
    return verdict


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        message = str(longrepr[2])
    else:
        message = str(longrepr)
    return message.removeprefix("Skipped: ")


def whole_suite(config: pytest.Config) -> bool:
    """Whether this run selects every test: pytest's testpaths, nothing filtered out."""
    option = config.option
    return (
        config.args_source == pytest.Config.ArgsSource.TESTPATHS
        and not getattr(option, "keyword", "")
        and not getattr(option, "markexpr", "")
        and not getattr(option, "deselect", None)
        and not getattr(option, "lf", False)
    )


class StrictSkips:
    """The pytest plugin: collects skips and ran tests, judges them at the session's end."""

    def __init__(self, source: Path, expected: list[ExpectedSkip]) -> None:
        self.source = source
        self.expected = expected
        self.skipped: dict[str, str] = {}
        self.ran: set[str] = set()
        self.verdict = Verdict()

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:
            self.skipped[report.nodeid] = _skip_reason(report)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.ran.add(report.nodeid)
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skipped[report.nodeid] = _skip_reason(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.verdict = judge(
            self.expected, self.skipped, self.ran, whole_suite=whole_suite(session.config)
        )
        if session.exitstatus == pytest.ExitCode.OK and self.verdict:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.verdict:
            return
        terminalreporter.section(f"strict skips ({ENV}=1)", sep="=", red=True, bold=True)
        for line in self.verdict.lines(self.source):
            terminalreporter.line(line, red=True)
        try:
            source = self.source.relative_to(terminalreporter.config.rootpath)
        except ValueError:
            source = self.source
        terminalreporter.line(
            f"A test may skip under {ENV}=1 only when {source} lists it with its reason "
            "(docs/development.md, Tests: Skips)."
        )
