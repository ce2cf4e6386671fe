"""``python -m hack.fake_thunder`` as a process: URL on the first line, seed, signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from hack.fake_thunder import FakeThunderStartError, start_fake_thunder
from hack.fake_thunder.process import REPO_ROOT, read_base_url

SEED = {
    "apiTokens": [{"token": "seeded-token", "capabilities": None}],
    "zones": [
        {"zoneId": "zone-b", "displayName": "dup"},
        {"zoneId": "zone-a", "displayName": "dup"},
    ],
    "hosts": [{"serverId": "h1", "zoneId": "zone-a", "gpuType": "H100", "gpuCount": 8}],
    "switches": {"serverIdSpelling": True},
}


def test_seeded_process_serves_its_seed(tmp_path: Path) -> None:
    seed_file = tmp_path / "seed.json"
    seed_file.write_text(json.dumps(SEED))
    with start_fake_thunder(tokens=["cli-token"], seed=seed_file) as fake:
        assert fake.base_url.startswith("http://127.0.0.1:")
        headers = {"Authorization": "Bearer seeded-token"}
        hosts = httpx.get(f"{fake.base_url}/api/v1/hosts", headers=headers).json()["hosts"]
        assert hosts[0]["serverId"] == "h1"
        cli = httpx.get(
            f"{fake.base_url}/api/v1/zones", headers={"Authorization": "Bearer cli-token"}
        )
        assert sorted(z["zoneId"] for z in cli.json()["zones"]) == ["zone-a", "zone-b"]
        fake.admin.add_zone("extra")
        fake.admin.reset()
        assert len(fake.admin.state()["zones"]) == 2
        assert fake.admin.switches()["serverIdSpelling"] is True
    assert fake.process.returncode == 0


def test_mapping_seed_and_temp_files_are_cleaned(tmp_path: Path) -> None:
    with start_fake_thunder(seed=SEED) as fake:
        log_path = fake.log_path
        assert fake.admin.state()["zones"][0]["displayName"] == "dup"
    assert not log_path.exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_first_line_is_the_url_and_signals_stop_it(signum: signal.Signals) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    process = subprocess.Popen(
        [sys.executable, "-m", "hack.fake_thunder", "--listen", "127.0.0.1:0", "--token", "t"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        url = read_base_url(process, timeout=30)
        assert url is not None
        answer = httpx.get(f"{url}/api/v1/zones", headers={"Authorization": "Bearer t"})
        assert answer.json() == {"zones": []}
        process.send_signal(signum)
        assert process.wait(timeout=20) == 0
        assert process.stdout.read() == b""
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def test_start_failure_is_reported(tmp_path: Path) -> None:
    seed = tmp_path / "broken.json"
    seed.write_text("{not json")
    with pytest.raises(FakeThunderStartError, match="did not print its URL"):
        start_fake_thunder(seed=seed, startup_timeout=20)
