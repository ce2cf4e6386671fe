"""How long the unit suite takes, as `make unit` runs it and in one process.

    python -m bench.unit_suite [--runs 3] [--no-write]

Runs the unit suite as a fresh process and measures the wall time of the whole process
(start-up, collection, every test, teardown), its CPU time and that of its children (the
pytest-xdist workers, helm, kubectl, the build backend), and the share of the machine's
CPU the hypervisor took meanwhile. Two settings, `--runs` times each, alternating so that
a drift of the machine's speed touches both alike:

- `make unit`: `pytest tests/unit -m unit -q -n auto`, one worker per CPU;
- one process: the same with `-n 0` (`make unit UNIT_WORKERS=0`), the suite's serial cost.

Before the first run the project's `__pycache__` folders are removed: that run is a fresh
clone's first `make unit`, which compiles and caches every module, and is reported apart.
The load average before the runs is printed: figures from a busy machine say little. The
figures go to the "Unit suite" section of docs/benchmarks.md unless `--no-write`. This is
not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.docsection import DOC, INTRO, command_line, replace_section

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Unit suite"
COMMAND = [
    sys.executable,
    "-m",
    "pytest",
    "tests/unit",
    "-m",
    "unit",
    "-q",
    "-p",
    "no:cacheprovider",
]
EVERY_CPU = [*COMMAND, "-n", "auto"]
ONE_PROCESS = [*COMMAND, "-n", "0"]
_SUMMARY = re.compile(r"(\d+) passed.* in ([0-9.]+)s")


@dataclass(frozen=True)
class Run:
    wall: float
    cpu: float  # the pytest process and its children, user + system
    tests: int
    pytest_seconds: float  # what pytest reports: collection and tests, not start-up
    steal: float  # share of the machine's CPU time the hypervisor took during the run


def _cpu_times() -> list[int]:
    """The machine's CPU times (/proc/stat's first line): user, nice, system, idle, ..."""
    return [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]


def _clear_bytecode() -> None:
    for top in ("thunder_dra", "hack", "tests", "bench"):
        for folder in (REPO / top).rglob("__pycache__"):
            shutil.rmtree(folder, ignore_errors=True)


def _run(command: list[str], env: dict[str, str]) -> Run:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    machine_before = _cpu_times()
    start = time.perf_counter()
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=900
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent = [b - a for a, b in zip(machine_before, _cpu_times(), strict=True)]
    steal = spent[7] / max(1, sum(spent)) if len(spent) > 7 else 0.0
    tail = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    found = _SUMMARY.search(tail)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"the unit suite failed (exit {done.returncode}): {tail}\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Run(wall, cpu, int(found.group(1)), float(found.group(2)), steal)


def measure(runs: int) -> dict[str, list[Run]]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    _clear_bytecode()
    first = _run(EVERY_CPU, env)
    every_cpu, one_process = [], []
    for _ in range(runs):
        every_cpu.append(_run(EVERY_CPU, env))
        one_process.append(_run(ONE_PROCESS, env))
    return {
        "first `make unit` of a fresh clone (every CPU, compiling every module)": [first],
        "`make unit` (every CPU)": every_cpu,
        "one process (`UNIT_WORKERS=0`)": one_process,
    }


def render(results: dict[str, list[Run]], command: str, load: str) -> str:
    tests = next(iter(results.values()))[0].tests
    lines = [
        SECTION,
        "",
        f"Command: `{command}` ({platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; load average before the runs: {load}).",
        "",
        f"What is timed: the unit suite ({tests} tests), each run a fresh process, wall "
        "time from its start to its exit. CPU counts the pytest process and its children "
        "(the pytest-xdist workers, helm, kubectl, the build backend).",
        "",
        "| setting | runs | wall s, median | wall s, min | CPU s, median | pytest's own s "
        "| CPU stolen |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, runs in results.items():
        lines.append(
            f"| {name} | {len(runs)} | {statistics.median(r.wall for r in runs):.1f} | "
            f"{min(r.wall for r in runs):.1f} | {statistics.median(r.cpu for r in runs):.1f} | "
            f"{statistics.median(r.pytest_seconds for r in runs):.1f} | "
            f"{statistics.median(r.steal for r in runs):.0%} |"
        )
    lines += [
        "",
        "`make unit` runs one pytest-xdist worker per CPU; the one-process row is the "
        "suite's serial cost, what it takes where there is a single CPU. The settings "
        'alternate, run by run. "CPU stolen" is the share of the machine\'s CPU time the '
        "hypervisor gave to others during the runs (/proc/stat): the same suite takes "
        "longer, in CPU time too, when it is high. The target is the whole unit suite under "
        "a minute.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.unit_suite", description=__doc__)
    parser.add_argument("--runs", type=int, default=3, help="runs of each setting")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    results = measure(args.runs)
    text = render(results, command_line("bench.unit_suite", args, ("runs",)), load)
    print(text)
    if not args.no_write:
        replace_section(DOC, SECTION, text, intro=INTRO)
    return 0


if __name__ == "__main__":
    sys.exit(main())
