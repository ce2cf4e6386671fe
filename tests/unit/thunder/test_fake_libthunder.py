"""The fake libthunder.so (hack/fake_thunder/library.py): its cached build, and what its
constructor prints when preloaded into a real process (never a value of config.json)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from hack.fake_thunder import FakeThunder
from hack.fake_thunder.library import (
    LIBRARY_NAME,
    PRELOADED_LINE,
    SOURCE,
    Compiler,
    LibraryBuildError,
    build_library,
    cache_key,
    library,
    library_sha256,
    loader_errors,
    preloaded_lines,
)
from thunder_dra.plugin.files.cdi import CONFIG_CONTAINER_PATH

AUTH_TOKEN = "tcc_Fake-Client-Credential-9f2e"
JWT = "eyJhbGciOiJSUzI1NiJ9.eyJjbGllbnRJZCI6ImNsLTEifQ.c2lnbmF0dXJl"
# config.json as the daemon writes it (docs/thunder-api.md section 4).
CONFIG = {
    "deviceId": "cl-7d3a",
    "clientId": "cl-7d3a",
    "orgId": "org-fake",
    "gpuType": "A6000",
    "gpuCount": 2,
    "centralApiUrl": "https://api.example.test",
    "authToken": AUTH_TOKEN,
    "claims": JWT,
    "enableGrpcTls": False,
    "thunderdDiscoveryEnabled": True,
    "telemetryCollector": "https://telemetry.example.test:2096",
}


@pytest.fixture(scope="module")
def compiler() -> Compiler:
    return Compiler.find()


def preloaded(
    library_path: Path, argv: list[str], config: Path | None
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_PRELOAD": str(library_path)}
    if config is not None:
        env["FAKE_LIBTHUNDER_CONFIG"] = str(config)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def test_a_build_is_cached_by_source_and_compiler(tmp_path: Path, compiler: Compiler) -> None:
    cache = tmp_path / "cache"
    built = build_library(cache=cache, compiler=compiler)
    key = cache_key(SOURCE.read_bytes(), compiler)
    assert built == cache / key / LIBRARY_NAME
    assert built.read_bytes()[:4] == b"\x7fELF"
    # A hit reads the cache and never runs the compiler (this one does not exist).
    absent = Compiler(str(tmp_path / "no-such-cc"), compiler.identity)
    assert build_library(cache=cache, compiler=absent) == built
    # Another source or another compiler is a miss: a new build, under another key.
    edited = tmp_path / "libthunder.c"
    edited.write_bytes(SOURCE.read_bytes() + b"\n/* edited */\n")
    rebuilt = build_library(cache=cache, source=edited, compiler=compiler)
    assert rebuilt != built
    assert rebuilt.is_file()
    other = Compiler(compiler.path, compiler.identity + " (upgraded)")
    assert build_library(cache=cache, compiler=other).parent.name != key
    # A miss with a compiler that cannot run fails, naming it.
    with pytest.raises(LibraryBuildError, match="no-such-cc"):
        build_library(cache=cache, compiler=Compiler(absent.path, "another compiler"))
    # Only the finished libraries remain, no temporary build folders.
    assert sorted(p.name for p in cache.glob("*/*")) == [LIBRARY_NAME] * 3


def test_a_failed_compile_says_why_and_caches_nothing(tmp_path: Path, compiler: Compiler) -> None:
    broken = tmp_path / "libthunder.c"
    broken.write_text("this is not C\n")
    with pytest.raises(LibraryBuildError, match="failed"):
        build_library(cache=tmp_path / "cache", source=broken, compiler=compiler)
    assert not list((tmp_path / "cache").glob("*/*"))


async def test_the_served_library_is_the_build_and_the_installer_pins_it() -> None:
    assert library() == build_library().read_bytes()
    assert library_sha256() == hashlib.sha256(library()).hexdigest()
    transport = FakeThunder().transport()
    async with httpx.AsyncClient(transport=transport, base_url="http://fake") as http:
        served = await http.get("/artifacts/libthunder.so")
        installer = (await http.get("/artifacts/install.sh")).text
    assert served.content == library()
    assert f'libthunder_sha256="{library_sha256()}"\n' in installer


def test_preloaded_it_reports_config_json_keys_and_never_a_value(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG, indent=2))
    done = preloaded(build_library(), ["/bin/true"], config)
    assert done.returncode == 0, done.stderr
    assert not loader_errors(done.stderr), done.stderr
    [line] = preloaded_lines(done.stderr)
    assert line.startswith(f"{PRELOADED_LINE}true (pid ")
    size = len(config.read_bytes())
    assert line.endswith(f"; {config} read: {size} bytes, keys: {','.join(CONFIG)}"), line
    for value in CONFIG.values():
        if isinstance(value, str):
            assert value not in line.replace(str(config), "")
    assert AUTH_TOKEN not in done.stderr + done.stdout
    assert not any(part in done.stderr for part in JWT.split("."))


def test_every_process_of_a_workload_reports_and_runs_on(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"authToken": AUTH_TOKEN, "nested": {"inner": "x"}}))
    script = "echo out; /bin/true; exit 3"
    done = preloaded(build_library(), ["/bin/sh", "-c", script], config)
    assert (done.returncode, done.stdout) == (3, "out\n")
    lines = preloaded_lines(done.stderr)
    assert len(lines) == 2, done.stderr  # the shell and /bin/true
    assert all(line.endswith("keys: authToken,nested") for line in lines), lines
    assert AUTH_TOKEN not in done.stderr


def test_a_missing_config_json_is_reported_and_harmless(tmp_path: Path) -> None:
    missing = tmp_path / "absent" / "config.json"
    done = preloaded(build_library(), ["/bin/true"], missing)
    assert done.returncode == 0
    [line] = preloaded_lines(done.stderr)
    assert line.endswith(f"; {missing} not read: No such file or directory"), line


def test_without_the_test_variable_it_reads_the_mounted_path() -> None:
    done = preloaded(build_library(), ["/bin/true"], None)
    assert done.returncode == 0
    [line] = preloaded_lines(done.stderr)
    assert f"; {CONFIG_CONTAINER_PATH} " in line, line


def test_the_loaders_refusal_is_recognised() -> None:
    refusal = (
        "ERROR: ld.so: object '/etc/thunder/libthunder.so' from LD_PRELOAD cannot be "
        "preloaded (wrong ELF class: ELFCLASS32): ignored."
    )
    assert loader_errors(f"a\n{refusal}\nb\n") == [refusal]
    assert preloaded_lines(refusal) == []
