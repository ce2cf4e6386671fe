"""The OLM bundle passes the operator-framework's own validators, OperatorHub suite included."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def validator() -> str:
    built = subprocess.run(
        [str(REPO / "release" / "build-bundle-validate.sh")],
        check=True,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    return built.stdout.strip()


def test_bundle_validates_without_errors_or_warnings(validator: str) -> None:
    done = subprocess.run(
        [validator, "-warnings-as-errors", str(REPO / "bundle")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 errors, 0 warnings" in done.stdout


def test_the_validators_catch_a_broken_csv(validator: str, tmp_path: Path) -> None:
    broken = tmp_path / "bundle"
    shutil.copytree(REPO / "bundle", broken)
    csv_path = broken / "manifests" / "thunder-device-plugin.clusterserviceversion.yaml"
    csv = yaml.safe_load(csv_path.read_text())
    csv["spec"]["minKubeVersion"] = "not-a-version"
    csv["spec"]["icon"][0]["mediatype"] = "image/bmp"
    csv["metadata"]["annotations"]["categories"] = "GPU Things"
    csv_path.write_text(yaml.safe_dump(csv))
    done = subprocess.run([validator, str(broken)], capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert "MinKubeVersion has an invalid value" in done.stdout
    assert "does not have a valid mediatype" in done.stdout
    assert "not in the set of standard categories" in done.stdout
