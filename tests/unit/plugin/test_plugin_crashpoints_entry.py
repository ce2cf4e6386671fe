"""Crash points are honoured only through the test-only entry point, never from the environment.

Production images ship `thunder_dra` alone; `hack.daemon_under_test` (the only way to arm a
crash point) is not in them, so no ThunderCluster, chart value or environment variable can
make a production daemon crash on purpose.
"""

from __future__ import annotations

import inspect

import pytest

from hack import daemon_under_test
from thunder_dra.plugin import daemon
from thunder_dra.plugin.state import crashpoints


def test_the_daemon_does_not_read_crash_points_from_its_environment() -> None:
    source = inspect.getsource(daemon) + inspect.getsource(crashpoints)
    assert "os.environ" not in source
    assert "getenv" not in source
    assert not hasattr(crashpoints.CrashPoints, "from_env")
    assert inspect.signature(daemon.Daemon).parameters["crash"].default is None


def test_the_test_entry_point_arms_a_known_step() -> None:
    crash, rest = daemon_under_test.split_crash_args(
        ["--crash-at", "prepare:cdi-written@2", "--log-level", "debug"]
    )
    assert crash.armed
    assert rest == ["--log-level", "debug"]
    unarmed, rest = daemon_under_test.split_crash_args(["--log-level", "debug"])
    assert not unarmed.armed


@pytest.mark.parametrize("spec", ["prepare:typo", "prepare:cdi-written@0", "enroll:installed@x"])
def test_an_unknown_step_or_bad_occurrence_is_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="crash"):
        crashpoints.CrashPoints.parse(spec)
