"""Install commands: quoting that survives a real shell, exact assignments, no token in text."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from thunder_dra.plugin.files import guest
from thunder_dra.plugin.node.hostrunner import CommandResult, LocalRunner

TOKEN = "tr_client_token_AbC123"
NASTY = 'it\'s a "zone" with $HOME `id` \\ and\nnewline'


@pytest.mark.parametrize("value", ["", "plain", "it's", "''", NASTY, "'\"'\"'", "a b\tc"])
def test_shell_quote_round_trips_through_sh(value: str) -> None:
    out = subprocess.run(
        ["sh", "-c", f"printf %s {guest.shell_quote(value)}"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == value


def test_shell_quote_uses_the_contract_escape() -> None:
    assert guest.shell_quote("it's") == "'it'\"'\"'s'"


@pytest.fixture
def fake_host(tmp_path: Path) -> tuple[LocalRunner, Path]:
    """curl writes an installer that records its environment; sudo records any use."""
    logs = tmp_path / "logs"
    logs.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    installer = (
        f'printf "%s\\n" "$THUNDER_INSTALL_MODE" "$THUNDER_CENTRAL_URL" '
        f'"$THUNDER_ENROLLMENT_TOKEN" > {logs}/installer.env\n'
        "echo installer-ran\n"
    )
    scripts = {
        "curl": (
            f"printf '%s\\0' \"$@\" > {logs}/curl.args\n"
            'while [ "$#" -gt 0 ]; do [ "$1" = -o ] && out="$2"; shift; done\n'
            f"cat > \"$out\" <<'EOF'\n{installer}EOF\n"
        ),
        "sudo": f"printf '%s\\0' \"$@\" > {logs}/sudo.args\nexit 1\n",
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
    return LocalRunner(path_prefix=[bin_dir]), logs


def _args(path: Path) -> list[str]:
    return path.read_text().split("\0")[:-1]


API = "https://api.example/it's/"
INSTALL = "https://get.example/install.sh?v='1'"


async def _run_guest(
    tmp_path: Path, runner: LocalRunner, script: str, token: str | None = TOKEN
) -> tuple[Path, CommandResult]:
    script_path = tmp_path / guest.GUEST_SCRIPT_KEY
    script_path.write_text(script)
    token_file = tmp_path / "enrollment-token"
    if token is not None:
        token_file.write_text(token)
    result = await runner.run(
        ["bash", str(script_path)], env={"THUNDER_ENROLLMENT_TOKEN_FILE": str(token_file)}
    )
    return script_path, result


async def test_guest_script_installs_with_the_token_from_the_file_and_no_sudo(
    tmp_path: Path, fake_host: tuple[LocalRunner, Path]
) -> None:
    runner, logs = fake_host
    script = guest.guest_install_script(api_url=API, install_url=INSTALL)
    assert TOKEN not in script
    assert "sudo" not in script
    _, result = await _run_guest(tmp_path, runner, script, TOKEN + "\n")
    assert result.ok, result.stderr
    assert result.stdout == "installer-ran\n"
    [url, flag, _target] = _args(logs / "curl.args")[1:]
    assert (url, flag) == (INSTALL, "-o")
    assert not (logs / "sudo.args").exists()
    assert (logs / "installer.env").read_text().splitlines() == [
        "client",
        "https://api.example/it's",
        TOKEN,
    ]


async def test_guest_script_refuses_an_installer_with_another_digest(
    tmp_path: Path, fake_host: tuple[LocalRunner, Path]
) -> None:
    runner, logs = fake_host
    pin = "0" * 64
    script = guest.guest_install_script(api_url=API, install_url=INSTALL, installer_sha256=pin)
    _, result = await _run_guest(tmp_path, runner, script)
    assert result.returncode == 1
    assert f"not the pinned {pin}; refused" in result.stderr
    assert not (logs / "installer.env").exists()
    with pytest.raises(guest.InstallCommandError, match="SHA-256"):
        guest.guest_install_script(api_url=API, install_url=INSTALL, installer_sha256="abc")


@pytest.mark.parametrize("content", [None, "", " \n"])
async def test_guest_script_fails_without_a_token(
    tmp_path: Path, fake_host: tuple[LocalRunner, Path], content: str | None
) -> None:
    runner, logs = fake_host
    script = guest.guest_install_script(api_url=API, install_url=INSTALL)
    _, result = await _run_guest(tmp_path, runner, script, content)
    assert result.returncode == 1
    assert "no enrollment token" in result.stderr
    assert not (logs / "curl.args").exists()


def test_guest_script_defaults_to_the_mounted_secret() -> None:
    script = guest.guest_install_script(api_url=API, install_url=INSTALL)
    assert "${THUNDER_ENROLLMENT_TOKEN_FILE:-/mnt/thunder-setup/enrollment-token}" in script
    assert script.startswith("#!/usr/bin/env bash\n")
    assert "set -x" not in script
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)
        pinned = guest.guest_install_script(
            api_url=API, install_url=INSTALL, installer_sha256="a" * 64
        )
        subprocess.run(["bash", "-n"], input=pinned, text=True, check=True)


def _env(**changes: object) -> dict[str, str]:
    settings: dict[str, object] = {
        "server_token": TOKEN,
        "api_url": "https://registry.thundercompute.com/",
        "advertised_ip": "10.0.0.7",
        "zone_name": "us-east",
        "node_name": "node-1",
        "port_range": (32000, 32199),
    }
    settings.update(changes)
    return guest.host_install_env(**settings)  # type: ignore[arg-type]


def test_host_install_env_holds_the_contract_variables() -> None:
    assert guest.HOST_INSTALL_COMMAND == ("sh", "-s")
    assert TOKEN not in " ".join(guest.HOST_INSTALL_COMMAND)
    assert _env() == {
        "THUNDERD_TRANSIENT": "1",
        "THUNDER_INSTALL_MODE": "thunderd",
        "THUNDER_CENTRAL_URL": "https://registry.thundercompute.com",
        "THUNDER_ENROLLMENT_TOKEN": TOKEN,
        "THUNDERD_IP": "10.0.0.7",
        "THUNDER_ZONE": "us-east",
        "THUNDERD_NODE_NAME": "node-1",
        "THUNDERD_PORT_RANGE": "32000-32199",
    }
    assert "THUNDERD_PORT_RANGE" not in _env(port_range=None)


async def test_host_install_runs_the_given_text_with_the_token_in_env_only(
    fake_host: tuple[LocalRunner, Path],
) -> None:
    runner, _ = fake_host
    text = (
        'printf "%s|%s|%s\\n" "$THUNDER_ENROLLMENT_TOKEN" "$THUNDER_ZONE" "$THUNDERD_IP"\n'
        "tr '\\0' ' ' < /proc/$$/cmdline\n"
    )
    env = _env(zone_name=NASTY, advertised_ip="fd00::7")
    result = await runner.run(list(guest.HOST_INSTALL_COMMAND), env=env, input=text)
    assert result.ok, result.stderr
    assert result.stdout.startswith(f"{TOKEN}|{NASTY}|fd00::7\n")
    cmdline = result.stdout.rsplit("\n", 1)[1]
    assert cmdline == "sh -s "
    assert TOKEN not in cmdline


def test_host_install_validates_its_inputs() -> None:
    with pytest.raises(guest.InstallCommandError, match="not an IP"):
        _env(advertised_ip="10.0.0.7; rm -rf /")
    with pytest.raises(guest.InstallCommandError, match="port range"):
        _env(port_range=(32199, 32000))
    with pytest.raises(guest.InstallCommandError, match="port range"):
        _env(port_range=(0, 10))
    with pytest.raises(guest.InstallCommandError, match="zone name"):
        _env(zone_name="")
    with pytest.raises(guest.InstallCommandError, match="server enrollment token"):
        _env(server_token="")


async def test_host_restart_command_is_argv_and_env(tmp_path: Path) -> None:
    argv, env = guest.host_restart_command(advertised_ip="10.0.0.7", zone_name=NASTY, node_name="n")
    assert env == {"THUNDERD_TRANSIENT": "1"}
    fake = tmp_path / "thunder"
    fake.write_text('#!/bin/sh\nprintf "%s\\0" "$THUNDERD_TRANSIENT" "$@"\n')
    fake.chmod(0o755)
    result = await LocalRunner(path_prefix=[tmp_path]).run(argv, env=env)
    assert result.stdout.split("\0")[:-1] == [
        "1",
        "up",
        "--ip",
        "10.0.0.7",
        "--zone",
        NASTY,
        "--node-name",
        "n",
    ]


def test_guest_secret_name() -> None:
    assert guest.guest_secret_name("vm-claim") == "vm-claim-thunder-setup"
    with pytest.raises(guest.InstallCommandError, match="exceed"):
        guest.guest_secret_name("a" * 250)
