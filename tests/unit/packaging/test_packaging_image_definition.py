"""make image follows the Dockerfiles: it reads their final stage and refuses what it cannot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hack import image

REPO = Path(__file__).resolve().parents[3]


def test_daemon_dockerfile_is_read_as_the_image_definition() -> None:
    daemon = image.parse_dockerfile(REPO / "containers" / "daemon.Dockerfile", "9.9.9")
    assert (daemon.suite, daemon.python) == ("bookworm", "3.11")
    assert daemon.user == "0:0"
    assert daemon.entrypoint == ["python", "-m", "thunder_dra.plugin"]
    assert "util-linux" in daemon.packages
    assert daemon.labels["org.opencontainers.image.version"] == "9.9.9"


def test_operator_dockerfile_creates_its_unprivileged_user() -> None:
    operator = image.parse_dockerfile(REPO / "containers" / "operator.Dockerfile", "1.0.0")
    assert operator.user == "65532:65532"
    assert [argv[0] for argv in operator.account_commands] == ["groupadd", "useradd"]
    assert "9443/tcp" in operator.exposed


def test_a_step_the_builder_cannot_follow_is_refused_by_name(tmp_path: Path) -> None:
    dockerfile = tmp_path / "x.Dockerfile"
    dockerfile.write_text(
        "ARG PYTHON_IMAGE=python:3.11-slim-bookworm\nFROM ${PYTHON_IMAGE}\n"
        'RUN curl -o /x https://example.invalid/x\nENTRYPOINT ["python"]\n'
    )
    with pytest.raises(image.ImageError, match="curl -o /x"):
        image.parse_dockerfile(dockerfile, "1")


def test_a_base_that_is_not_debian_python_is_refused(tmp_path: Path) -> None:
    dockerfile = tmp_path / "x.Dockerfile"
    dockerfile.write_text('FROM alpine:3.20\nENTRYPOINT ["sh"]\n')
    with pytest.raises(image.ImageError, match=re.escape("'alpine:3.20'")):
        image.parse_dockerfile(dockerfile, "1")
