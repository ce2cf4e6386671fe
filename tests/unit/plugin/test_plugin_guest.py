"""Install commands: quoting that survives a real shell, exact assignments, no token in text."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from thunder_dra.plugin import guest
from thunder_dra.plugin.hostrunner import LocalRunner

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
    """curl prints an installer; sudo records its arguments and runs the rest as root would."""
    logs = tmp_path / "logs"
    logs.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "curl": f"printf '%s\\0' \"$@\" > {logs}/curl.args\necho 'echo installer-ran'\n",
        "sudo": (
            f"printf '%s\\0' \"$@\" > {logs}/sudo.args\n"
            f"env > {logs}/sudo.env\n"
            'while [ "${1#*=}" != "$1" ]; do export "$1"; shift; done\n'
            'exec "$@"\n'
        ),
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


async def test_guest_script_installs_with_the_token_from_the_file(
    tmp_path: Path, fake_host: tuple[LocalRunner, Path]
) -> None:
    runner, logs = fake_host
    script = guest.guest_install_script(api_url=API, install_url=INSTALL)
    assert TOKEN not in script
    script_path = tmp_path / guest.GUEST_SCRIPT_KEY
    script_path.write_text(script)
    token_file = tmp_path / "enrollment-token"
    token_file.write_text(TOKEN + "\n")

    result = await runner.run(
        ["bash", str(script_path)], env={"THUNDER_ENROLLMENT_TOKEN_FILE": str(token_file)}
    )
    assert result.ok, result.stderr
    assert result.stdout == "installer-ran\n"
    assert _args(logs / "curl.args") == ["-fsSL", INSTALL]
    assert _args(logs / "sudo.args") == [
        "THUNDER_INSTALL_MODE=client",
        "THUNDER_NOWARN=1",
        "THUNDER_CENTRAL_URL=https://api.example/it's",
        f"THUNDER_ENROLLMENT_TOKEN={TOKEN}",
        "sh",
    ]
    assert f"THUNDER_ENROLLMENT_TOKEN={TOKEN}" in (logs / "sudo.env").read_text()  # exported


@pytest.mark.parametrize("content", [None, "", " \n"])
async def test_guest_script_fails_without_a_token(
    tmp_path: Path, fake_host: tuple[LocalRunner, Path], content: str | None
) -> None:
    runner, logs = fake_host
    script_path = tmp_path / "install.sh"
    script_path.write_text(guest.guest_install_script(api_url=API, install_url=INSTALL))
    token_file = tmp_path / "enrollment-token"
    if content is not None:
        token_file.write_text(content)
    result = await runner.run(
        ["bash", str(script_path)], env={"THUNDER_ENROLLMENT_TOKEN_FILE": str(token_file)}
    )
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


def test_host_install_command_shape() -> None:
    command = guest.host_install_command(
        install_url="https://get.thundercompute.com/install.sh",
        api_url="https://registry.thundercompute.com/",
        advertised_ip="10.0.0.7",
        zone_name="us-east",
        node_name="node-1",
        port_range=(32000, 32199),
    )
    assert command == (
        "curl -fsSL 'https://get.thundercompute.com/install.sh' | sudo THUNDERD_TRANSIENT=1 "
        "THUNDER_INSTALL_MODE=thunderd THUNDER_CENTRAL_URL='https://registry.thundercompute.com' "
        'THUNDER_ENROLLMENT_TOKEN="${THUNDER_ENROLLMENT_TOKEN:?the server enrollment token is '
        "not set}\" THUNDERD_IP='10.0.0.7' THUNDER_ZONE='us-east' THUNDERD_NODE_NAME='node-1' "
        "THUNDERD_PORT_RANGE='32000-32199' sh"
    )


async def test_host_install_runs_with_the_token_from_env(
    fake_host: tuple[LocalRunner, Path],
) -> None:
    runner, logs = fake_host
    command = guest.host_install_command(
        install_url=INSTALL,
        api_url=API,
        advertised_ip="fd00::7",
        zone_name=NASTY,
        node_name="node-1",
    )
    assert TOKEN not in command
    result = await runner.run(command, env=guest.host_install_env(TOKEN))
    assert result.ok, result.stderr
    assert _args(logs / "sudo.args") == [
        "THUNDERD_TRANSIENT=1",
        "THUNDER_INSTALL_MODE=thunderd",
        "THUNDER_CENTRAL_URL=https://api.example/it's",
        f"THUNDER_ENROLLMENT_TOKEN={TOKEN}",
        "THUNDERD_IP=fd00::7",
        f"THUNDER_ZONE={NASTY}",
        "THUNDERD_NODE_NAME=node-1",
        "sh",
    ]


async def test_host_install_refuses_to_run_without_the_token(
    fake_host: tuple[LocalRunner, Path],
) -> None:
    runner, logs = fake_host
    command = guest.host_install_command(
        install_url=INSTALL, api_url=API, advertised_ip="10.0.0.7", zone_name="z", node_name="n"
    )
    result = await runner.run(command, env={"THUNDER_ENROLLMENT_TOKEN": ""})
    assert not result.ok
    assert "the server enrollment token is not set" in result.stderr
    assert not (logs / "sudo.args").exists()


def _host_command(
    advertised_ip: str = "10.0.0.7",
    zone_name: str = "z",
    port_range: tuple[int, int] | None = None,
) -> str:
    return guest.host_install_command(
        install_url=INSTALL,
        api_url=API,
        advertised_ip=advertised_ip,
        zone_name=zone_name,
        node_name="n",
        port_range=port_range,
    )


def test_host_install_validates_its_inputs() -> None:
    with pytest.raises(guest.InstallCommandError, match="not an IP"):
        _host_command(advertised_ip="10.0.0.7; rm -rf /")
    with pytest.raises(guest.InstallCommandError, match="port range"):
        _host_command(port_range=(32199, 32000))
    with pytest.raises(guest.InstallCommandError, match="port range"):
        _host_command(port_range=(0, 10))
    with pytest.raises(guest.InstallCommandError, match="zone name"):
        _host_command(zone_name="")
    with pytest.raises(guest.InstallCommandError):
        guest.host_install_env("")


def test_host_restart_command_round_trips(tmp_path: Path) -> None:
    command = guest.host_restart_command(advertised_ip="10.0.0.7", zone_name=NASTY, node_name="n")
    assert command.startswith("THUNDERD_TRANSIENT=1 thunder up --ip '10.0.0.7' --zone ")
    fake = tmp_path / "thunder"
    fake.write_text('#!/bin/sh\nprintf "%s\\0" "$THUNDERD_TRANSIENT" "$@"\n')
    fake.chmod(0o755)
    out = subprocess.run(
        ["sh", "-c", command],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
    )
    assert out.stdout.split("\0")[:-1] == [
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
