"""The host runner: results, env, fake host tools on PATH, timeouts that kill the group."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from tests.support.forkhandlers import run_where_forked_children_abort
from thunder_dra.plugin.node import hostrunner as hr

SECRET = "tr_server_token_0123456789"


def _script(directory: Path, name: str, body: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


async def test_argv_result() -> None:
    result = await hr.LocalRunner().run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert result == hr.CommandResult(returncode=3, stdout="out\n", stderr="err\n")
    assert not result.ok


async def test_shell_string_env_and_input() -> None:
    result = await hr.LocalRunner(extra_env={"GREETING": "hi"}).run(
        'printf "%s %s " "$GREETING" "$NAME"; cat', env={"NAME": "node-1"}, input="stdin-data"
    )
    assert result.ok
    assert result.stdout == "hi node-1 stdin-data"


async def test_fake_host_tools_come_first_on_path(tmp_path: Path) -> None:
    fake_bin = tmp_path / "host-bin"
    _script(fake_bin, "thunder", 'echo \'{"healthy": true}\'; echo "args: $*" >&2\n')
    runner = hr.LocalRunner(path_prefix=[fake_bin])
    result = await runner.run(["thunder", "status", "--json"])
    assert result.stdout == '{"healthy": true}\n'
    assert result.stderr == "args: status --json\n"


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    command = f"sleep 30 & echo $! > {pid_file}; wait"
    started = time.monotonic()
    with pytest.raises(hr.HostCommandTimeout, match=r"within 0\.5s"):
        await hr.LocalRunner().run(command, timeout=0.5)
    assert time.monotonic() - started < 10
    child = int(pid_file.read_text())
    for _ in range(100):
        if not _running(child):
            break
        await asyncio.sleep(0.02)
    else:
        pytest.fail(f"background child {child} survived the timeout")


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan stays a zombie until init reaps it)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat_line.rpartition(")")[2].split()[0] != "Z"


def test_redact_env() -> None:
    redacted = hr.redact_env(
        {
            "THUNDER_ENROLLMENT_TOKEN": SECRET,
            "MY_SECRET": "s",
            "API_KEY": "k",
            "THUNDER_ZONE": "us-east",
        }
    )
    assert redacted == {
        "THUNDER_ENROLLMENT_TOKEN": hr.REDACTED,
        "MY_SECRET": hr.REDACTED,
        "API_KEY": hr.REDACTED,
        "THUNDER_ZONE": "us-east",
    }


async def test_logs_never_show_secret_env_values_or_arguments(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=hr.__name__)
    result = await hr.LocalRunner().run(
        ["sh", "-c", 'test "$THUNDER_ENROLLMENT_TOKEN" = "$1"', "sh", SECRET],
        env={"THUNDER_ENROLLMENT_TOKEN": SECRET},
    )
    assert result.ok  # the command did get the real value
    assert caplog.records
    for record in caplog.records:
        assert SECRET not in record.getMessage()
        assert SECRET not in repr(record.__dict__)
    started = next(r for r in caplog.records if r.getMessage() == "running host command")
    assert started.env == {"THUNDER_ENROLLMENT_TOKEN": hr.REDACTED}  # type: ignore[attr-defined]
    with pytest.raises(hr.HostCommandTimeout):
        await hr.LocalRunner().run(["sh", "-c", "sleep 5", "sh", SECRET], timeout=0.2)
    assert all(SECRET not in repr(r.__dict__) for r in caplog.records)


async def test_host_namespace_runner_wraps_with_nsenter_and_drops_daemon_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in nsenter that records its options and runs what follows "--".
    args_file = tmp_path / "nsenter.args"
    fake = _script(
        tmp_path,
        "nsenter",
        f'echo "$*" > {args_file}\nwhile [ "$1" != "--" ]; do shift; done\nshift\nexec "$@"\n',
    )
    monkeypatch.setenv("THUNDER_API_TOKEN", SECRET)
    runner = hr.HostNamespaceRunner(nsenter=str(fake))
    result = await runner.run("env", env={"THUNDER_ZONE": "us-east"})
    assert args_file.read_text().split() == [
        "--target",
        "1",
        "--mount",
        "--uts",
        "--ipc",
        "--net",
        "--pid",
        "--",
        "/bin/sh",
        "-c",
        "env",
    ]
    env = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert env["THUNDER_ZONE"] == "us-east"
    assert env["PATH"] == hr.HOST_PATH
    assert "THUNDER_API_TOKEN" not in env
    assert SECRET not in result.stdout


async def test_empty_command_is_an_error() -> None:
    with pytest.raises(hr.HostCommandError):
        await hr.LocalRunner().run([])


def test_host_commands_start_without_the_daemons_fork_handlers() -> None:
    # The daemon serves gRPC while it runs host commands: a command started by fork()
    # would run gRPC's child-side fork handler, which can abort it before it execs.
    result = run_where_forked_children_abort(
        """
        import asyncio, json
        from thunder_dra.plugin.node.hostrunner import LocalRunner

        done = asyncio.run(LocalRunner().run(["sh", "-c", "echo ran"]))
        print(json.dumps([done.returncode, done.stdout]))
        """
    )
    assert result == [0, "ran\n"]
