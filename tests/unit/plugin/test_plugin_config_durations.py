"""The daemon's duration flags: Go durations as in the operator's flags, bare seconds still
read (command lines written for an earlier release) with a warning naming the flag."""

from __future__ import annotations

import logging

import pytest

from thunder_dra.api.thundercluster import ThunderClusterSpec
from thunder_dra.controllers.workload.daemonset import daemon_command
from thunder_dra.plugin.config import (
    DURATION_FLAGS,
    Intervals,
    ThunderTuning,
    parse_config,
    warn_bare_seconds,
)

pytestmark = pytest.mark.unit

ENV = {"NODE_NAME": "n", "POD_UID": "u", "THUNDER_API_TOKEN": "t"}
GO = [
    *("--thunder-timeout", "2s"),
    *("--thunder-retry-initial-backoff", "50ms"),
    *("--thunder-retry-max-backoff", "200ms"),
    *("--thunder-retry-budget", "15s"),
    *("--thunderd-check-interval", "500ms"),
    *("--enrollment-retry-max", "1m30s"),
    *("--sweep-interval", "1s"),
    *("--install-timeout", "15m"),
    *("--kube-timeout", "20s"),
]
BARE = [
    *("--thunder-timeout", "2"),
    *("--thunder-retry-initial-backoff", "0.05"),
    *("--thunder-retry-max-backoff", "0.2"),
    *("--thunder-retry-budget", "15"),
    *("--thunderd-check-interval", "0.5"),
    *("--enrollment-retry-max", "90"),
    *("--sweep-interval", "1"),
    *("--install-timeout", "900"),
    *("--kube-timeout", "20.0"),
]


def test_go_durations_and_bare_seconds_read_the_same() -> None:
    go, bare = parse_config(GO, ENV), parse_config(BARE, ENV)
    assert go.thunder == bare.thunder == ThunderTuning(2.0, 5, 0.05, 0.2, 15.0)
    assert go.intervals == bare.intervals == Intervals(0.5, 90.0, 1.0, 900.0)
    assert go.kube_timeout == bare.kube_timeout == 20.0
    assert go.bare_seconds_flags == {}
    assert bare.bare_seconds_flags == {
        "--thunder-timeout": "2s",
        "--thunder-retry-initial-backoff": "50ms",
        "--thunder-retry-max-backoff": "200ms",
        "--thunder-retry-budget": "15s",
        "--thunderd-check-interval": "500ms",
        "--enrollment-retry-max": "1m30s",
        "--sweep-interval": "1s",
        "--install-timeout": "15m",
        "--kube-timeout": "20s",
    }
    assert set(bare.bare_seconds_flags) == set(DURATION_FLAGS)


def test_the_defaults_are_unchanged_and_warn_about_nothing() -> None:
    config = parse_config([], ENV)
    assert (config.thunder, config.intervals) == (ThunderTuning(), Intervals())
    assert config.kube_timeout == 20.0
    assert config.bare_seconds_flags == {}


def test_each_bare_seconds_flag_is_named_in_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    config = parse_config(["--sweep-interval", "30", "--kube-timeout", "5s"], ENV)
    log = logging.getLogger("thunder_dra.plugin")
    with caplog.at_level(logging.WARNING):
        warn_bare_seconds(config, log)
    (record,) = caplog.records
    assert "deprecated" in record.getMessage()
    assert (record.__dict__["flag"], record.__dict__["read_as"]) == ("--sweep-interval", "30s")


@pytest.mark.parametrize("value", ["0", "0s", "-1s", "-3", "soon", "1d", "nan"])
def test_a_duration_must_be_a_positive_duration(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_config(["--sweep-interval", value], ENV)
    assert exit_.value.code == 2
    assert "--sweep-interval" in capsys.readouterr().err


def test_the_operators_daemon_command_reads_in_either_release() -> None:
    """The operator leaves every duration flag to the daemon's defaults, so its command line
    is read alike by a daemon image of an earlier release (bare seconds only) and this one."""
    command = daemon_command(ThunderClusterSpec.model_validate({}))
    assert not set(command) & set(DURATION_FLAGS)
    assert parse_config(command[3:], ENV).bare_seconds_flags == {}
