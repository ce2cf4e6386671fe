"""make build stamps the version; make image stops clearly without a docker engine."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from release import build_dist
from tests.unit.packaging.chartkit import REPO


def test_build_stamps_the_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_version = "9.8.7rc1"
    monkeypatch.setenv("BUILD_VERSION", env_version)
    artifacts = build_dist.build(tmp_path, build_dist.stamped_version())
    names = sorted(p.name for p in artifacts)
    assert names == [
        "thunder_device_plugin-9.8.7rc1-py3-none-any.whl",
        "thunder_device_plugin-9.8.7rc1.tar.gz",
    ]
    wheel = next(p for p in artifacts if p.suffix == ".whl")
    assert build_dist.wheel_version(wheel) == env_version


def test_default_version_carries_the_commit() -> None:
    version = build_dist.stamped_version()
    assert version.startswith(build_dist.project_version())


def test_images_stop_clearly_without_a_docker_engine(tmp_path: Path) -> None:
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}
    for action in ("build", "push", "buildx"):
        done = subprocess.run(
            [str(REPO / "release" / "images.sh"), action],
            env=env,
            check=False,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 2
        assert "docker info" in done.stderr
        assert "running docker engine" in done.stderr
