"""The fake host tools driven as subprocesses, as the node daemon's host runner will."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hack.fake_host import BIN_DIR, FakeHost
from hack.fake_thunder import FakeThunderProcess
from tests.integration.thunder.conftest import make_client


def run(host: FakeHost, command: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``command`` through ``/bin/sh -c`` on the fake host, as the daemon would."""
    environment = host.env({"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")})
    environment.update(env)
    return subprocess.run(
        ["/bin/sh", "-c", command],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


def install_command(fake: FakeThunderProcess, token: str, zone: str, port_range: str = "") -> str:
    words = [
        f"curl -fsSL {quote(fake.installer_url)} | sudo THUNDERD_TRANSIENT=1",
        "THUNDER_INSTALL_MODE=thunderd",
        f"THUNDER_CENTRAL_URL={quote(fake.base_url)}",
        f"THUNDER_ENROLLMENT_TOKEN={quote(token)}",
        "THUNDERD_IP='10.1.2.3'",
        f"THUNDER_ZONE={quote(zone)}",
        "THUNDERD_NODE_NAME='node-a'",
    ]
    if port_range:
        words.append(f"THUNDERD_PORT_RANGE={quote(port_range)}")
    return " ".join([*words, "sh"])


def mint_server_token(fake: FakeThunderProcess, zone_name: str) -> tuple[str, str, str]:
    async def mint() -> tuple[str, str, str]:
        async with make_client(fake) as client:
            zone = await client.ensure_zone(zone_name)
            minted = await client.mint_server_token(zone)
            return zone, minted.enrollment_token_id, minted.enrollment_token.reveal()

    return asyncio.run(mint())


def status_json(host: FakeHost) -> tuple[int, dict[str, Any]]:
    result = run(host, "thunder status --json")
    return result.returncode, json.loads(result.stdout)


def test_install_pipeline_registers_the_host(
    fake_thunder: FakeThunderProcess, fake_host: FakeHost
) -> None:
    fake_host.set_nvidia(gpus=["NVIDIA RTX A6000"] * 4)
    zone_name = "o'brien zone"
    zone, token_id, token = mint_server_token(fake_thunder, zone_name)
    result = run(fake_host, install_command(fake_thunder, token, zone_name, "32000-32199"))
    assert result.returncode == 0, result.stderr

    [host] = fake_thunder.admin.state()["hosts"]
    assert (host["zoneId"], host["gpuType"], host["gpuCount"]) == (zone, "A6000", 4)
    assert (host["hostname"], host["ip"], host["enrollmentTokenId"]) == (
        "node-a",
        "10.1.2.3",
        token_id,
    )
    assert fake_thunder.admin.token(token_id)["state"] == "spent"
    assert fake_thunder.admin.leaks() == []

    state = fake_host.thunder()
    assert state["installed"] is True
    assert state["transient"] is True
    assert state["enrollment"]["hostId"] == host["hostId"]
    assert state["enrollment"]["portRange"] == "32000-32199"
    code, document = status_json(fake_host)
    assert code == 0
    assert document["healthy"] is True

    calls = fake_host.calls()
    assert [c["tool"] for c in calls][:2] == ["sudo", "thunder-fake-installer"]
    assert token not in json.dumps(calls)
    assert calls[0]["env"]["THUNDERD_TRANSIENT"] == "1"
    assert [d["path"] for d in fake_thunder.admin.downloads()] == ["/artifacts/install.sh"]


@pytest.mark.parametrize("problem", ["spent", "wrong-zone", "no-driver", "missing-variable"])
def test_failed_installs_fail_the_pipeline(
    fake_thunder: FakeThunderProcess, fake_host: FakeHost, problem: str
) -> None:
    fake_host.set_nvidia(gpus=["NVIDIA H100 80GB HBM3"])
    _, _, token = mint_server_token(fake_thunder, "zone-1")
    command = install_command(fake_thunder, token, "zone-1")
    if problem == "spent":
        assert run(fake_host, command).returncode == 0
        fake_host.update_thunder({"installed": False})
    elif problem == "wrong-zone":
        command = install_command(fake_thunder, token, "zone-2")
    elif problem == "no-driver":
        fake_host.set_nvidia(mode="missing")
    else:
        command = command.replace("THUNDERD_IP='10.1.2.3' ", "")
    result = run(fake_host, command)
    assert result.returncode != 0
    assert "thunder installer:" in result.stderr
    assert token not in result.stderr + result.stdout
    assert fake_host.thunder()["installed"] is False
    assert len(fake_thunder.admin.state()["hosts"]) == (1 if problem == "spent" else 0)


def test_installer_is_inert_without_the_fake_backend(
    fake_thunder: FakeThunderProcess, tmp_path: Path
) -> None:
    host = FakeHost(tmp_path / "bare")
    result = subprocess.run(
        ["/bin/sh", "-c", f"curl -fsSL {quote(fake_thunder.installer_url)} | sh"],
        env={"PATH": "/usr/bin:/bin", "THUNDER_FAKE_HOST": str(host.root)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert fake_thunder.admin.state()["hosts"] == []


def test_client_mode_writes_the_client_config(
    fake_thunder: FakeThunderProcess, fake_host: FakeHost
) -> None:
    async def mint() -> tuple[str, str]:
        async with make_client(fake_thunder) as client:
            zone = await client.ensure_zone("vm-zone")
            minted = await client.mint_client_token(zone, "H100", 2)
            return minted.enrollment_token_id, minted.enrollment_token.reveal()

    token_id, token = asyncio.run(mint())
    command = (
        f"curl -fsSL {quote(fake_thunder.installer_url)} | sudo THUNDER_INSTALL_MODE=client "
        f"THUNDER_NOWARN=1 THUNDER_CENTRAL_URL={quote(fake_thunder.base_url)} "
        f'THUNDER_ENROLLMENT_TOKEN="${{THUNDER_ENROLLMENT_TOKEN}}" sh'
    )
    result = run(fake_host, command, THUNDER_ENROLLMENT_TOKEN=token)
    assert result.returncode == 0, result.stderr
    config = fake_host.client_config()
    assert config is not None
    assert set(config) == {
        "deviceId",
        "clientId",
        "orgId",
        "gpuType",
        "gpuCount",
        "centralApiUrl",
        "authToken",
        "claims",
        "enableGrpcTls",
        "thunderdDiscoveryEnabled",
        "telemetryCollector",
    }
    assert (config["gpuType"], config["gpuCount"]) == ("H100", 2)
    assert (
        config["deviceId"] == config["clientId"] == fake_thunder.admin.token(token_id)["clientId"]
    )


@pytest.mark.parametrize(
    ("status", "code", "active", "healthy"),
    [
        ("healthy", 0, "active", True),
        ("unhealthy", 1, "failed", False),
        ("activating", 1, "activating", False),
        ("unenrolled", 1, "failed", False),
    ],
)
def test_thunder_status_shapes(
    fake_host: FakeHost, status: str, code: int, active: str, healthy: bool
) -> None:
    fake_host.set_thunder(status=status, enrollment={"hostId": "h"})
    exit_code, document = status_json(fake_host)
    assert exit_code == code
    assert set(document) == {
        "service",
        "localApi",
        "config",
        "healthy",
        "warnings",
        "diagnostics",
        "recentLogs",
    }
    service = document["service"]
    assert set(service) == {"service", "active", "enabled", "load", "subState"}
    assert service["active"] == active
    assert document["healthy"] is healthy
    config = document["config"]
    assert config["authTokenConfigured"] is (status != "unenrolled")
    assert set(document["localApi"]) == {"healthy", "error"}
    if not healthy:
        [diagnostic] = document["diagnostics"]
        assert set(diagnostic) == {"severity", "message", "action"}


def test_thunder_not_installed_is_127(fake_host: FakeHost) -> None:
    result = run(fake_host, "thunder status --json")
    assert result.returncode == 127
    assert result.stdout == ""


def test_thunder_up_restores_health(fake_host: FakeHost) -> None:
    fake_host.set_thunder(status="unhealthy")
    refused = run(fake_host, "thunder up --ip 10.0.0.1 --zone z --node-name n")
    assert refused.returncode == 1
    fake_host.set_thunder(status="unhealthy", enrollment={"hostId": "h"})
    result = run(
        fake_host,
        "THUNDERD_TRANSIENT=1 thunder up --ip '10.0.0.1' --zone 'zone a' --node-name 'node-a'",
    )
    assert result.returncode == 0, result.stderr
    assert status_json(fake_host)[0] == 0
    assert fake_host.thunder()["lastUp"] == {
        "ip": "10.0.0.1",
        "zone": "zone a",
        "nodeName": "node-a",
        "transient": True,
    }


def test_nvidia_smi_modes(fake_host: FakeHost) -> None:
    query = "nvidia-smi --query-gpu=driver_version,name --format=csv,noheader"
    missing = run(fake_host, query)
    assert missing.returncode == 127
    assert "not found" in missing.stderr

    fake_host.set_nvidia(driver_version="535.104.05", gpus=["NVIDIA H100 80GB HBM3"] * 2)
    ok = run(fake_host, query)
    assert ok.returncode == 0
    assert ok.stdout.splitlines() == ["535.104.05, NVIDIA H100 80GB HBM3"] * 2
    with_header = run(fake_host, "nvidia-smi --query-gpu=name,memory.total --format=csv")
    assert with_header.stdout.splitlines()[0] == "name, memory.total [MiB]"
    assert "Driver Version: 535.104.05" in run(fake_host, "nvidia-smi").stdout
    assert run(fake_host, "nvidia-smi -L").stdout.startswith("GPU 0: NVIDIA H100 80GB HBM3")
    assert run(fake_host, "nvidia-smi --query-gpu=bogus --format=csv").returncode == 2

    fake_host.set_nvidia(mode="error")
    error = run(fake_host, query)
    assert error.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in error.stdout

    fake_host.set_nvidia(gpus=[])
    assert run(fake_host, query).returncode == 6


def test_tools_need_their_state_directory() -> None:
    result = subprocess.run(
        [str(BIN_DIR / "nvidia-smi")],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "THUNDER_FAKE_HOST is not set" in result.stderr


def test_sudo_applies_assignments_and_execs(fake_host: FakeHost) -> None:
    result = run(
        fake_host, "sudo -E GREETING='hello there' A_TOKEN=s3cret sh -c 'echo \"$GREETING\"'"
    )
    assert result.returncode == 0
    assert result.stdout == "hello there\n"
    assert "s3cret" not in json.dumps(fake_host.calls("sudo"))
    assert run(fake_host, "sudo").returncode == 1
    assert run(fake_host, "sudo no-such-command-here").returncode == 1
