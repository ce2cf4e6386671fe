"""`promtool check metrics` on a process's /metrics text, for the integration tests.

promtool comes from hack/ensure-promtool.sh (`make test` runs it before the tests); a
missing promtool fails the caller rather than skipping it.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not on PATH: run hack/ensure-promtool.sh (make test does)")
    return found


def metrics_problems(exposition: str) -> str:
    """What `promtool check metrics` reports about `exposition`; empty when it passes."""
    done = subprocess.run(
        [promtool(), "check", "metrics"],
        input=exposition,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    problems = (done.stdout + done.stderr).strip()
    if done.returncode != 0 and not problems:
        problems = f"promtool check metrics exited {done.returncode}"
    return problems
