"""Chart values cannot switch on test hooks or override what the driver sets itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.packaging.chartkit import RenderError, render


def _values(tmp_path: Path, section: str, name: str) -> str:
    path = tmp_path / "values.json"
    path.write_text(json.dumps({section: {"extraEnv": [{"name": name, "value": "1"}]}}))
    return str(path)


@pytest.mark.parametrize(
    ("section", "name"),
    [
        ("daemon", "THUNDER_DRA_CRASH_AT"),
        ("daemon", "THUNDER_API_TOKEN"),
        ("daemon", "NODE_NAME"),
        ("daemon", "POD_UID"),
        ("daemon", "PYTHONPATH"),
        ("daemon", "LD_PRELOAD"),
        ("operator", "THUNDER_DRA_NAMESPACE"),
        ("operator", "THUNDER_STANDALONE"),
        ("operator", "KUBECONFIG"),
        ("operator", "POD_ID"),
    ],
)
def test_a_reserved_extra_env_name_fails_the_install(
    tmp_path: Path, section: str, name: str
) -> None:
    with pytest.raises(RenderError) as caught:
        render("--values", _values(tmp_path, section, name))
    message = str(caught.value)
    assert "schema" in message
    assert "extraEnv" in message


@pytest.mark.parametrize("section", ["daemon", "operator"])
def test_an_ordinary_extra_env_name_renders(tmp_path: Path, section: str) -> None:
    manifests = render("--values", _values(tmp_path, section, "HTTPS_PROXY"))
    assert "HTTPS_PROXY" in str(manifests)
