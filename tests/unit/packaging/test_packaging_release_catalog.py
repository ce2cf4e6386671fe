"""``make catalog``'s stamping of a bundle for a release, without opm: what the CSV names
after it, and which versions and images it refuses before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from release import catalog as release_catalog
from release.bundle import BUNDLE, PACKAGE

OPERATOR = "127.0.0.1:5000/tc/thunder-device-plugin-operator:0.1.0-20261202T120000Z"
DAEMON = "127.0.0.1:5000/tc/thunder-device-plugin:0.1.0-20261202T120000Z"


def _csv(bundle: Path) -> dict[str, object]:
    path = bundle / "manifests" / release_catalog.CSV_FILE
    loaded = yaml.safe_load(path.read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_a_stamped_bundle_names_its_release_and_replaces_the_one_before(tmp_path: Path) -> None:
    release = release_catalog.Release(BUNDLE, "0.1.0-20261202T120000Z", OPERATOR, DAEMON)
    out = release_catalog.stamp(release, tmp_path / "b", "thunder-device-plugin.v0.0.9")
    csv = _csv(out)
    metadata, spec = csv["metadata"], csv["spec"]
    assert isinstance(metadata, dict)
    assert isinstance(spec, dict)
    # Object names are lowercase; the version keeps the tag as it is.
    assert metadata["name"] == f"{PACKAGE}.v0.1.0-20261202t120000z" == release.csv_name
    assert spec["version"] == "0.1.0-20261202T120000Z"
    assert spec["replaces"] == "thunder-device-plugin.v0.0.9"
    assert metadata["annotations"]["olm.skipRange"] == "<0.1.0-20261202T120000Z"
    assert metadata["annotations"]["containerImage"] == OPERATOR
    assert spec["relatedImages"] == [
        {"name": "operator", "image": OPERATOR},
        {"name": "daemon", "image": DAEMON},
    ]
    deployments = spec["install"]["spec"]["deployments"]
    containers = deployments[0]["spec"]["template"]["spec"]["containers"]
    assert [c["image"] for c in containers if c["name"] == "operator"] == [OPERATOR]
    # Everything else of the bundle is the bundle's own.
    for path in (BUNDLE / "manifests").iterdir():
        if path.name != release_catalog.CSV_FILE:
            assert (out / "manifests" / path.name).read_bytes() == path.read_bytes()
    assert not (out / "bundle.Dockerfile").exists()


def test_the_first_bundle_of_a_channel_replaces_nothing(tmp_path: Path) -> None:
    release = release_catalog.Release(BUNDLE, "0.1.0-20261202T120000Z", OPERATOR, DAEMON)
    spec = _csv(release_catalog.stamp(release, tmp_path / "b", None))["spec"]
    assert isinstance(spec, dict)
    assert "replaces" not in spec


@pytest.mark.parametrize(
    ("version", "operator", "named"),
    [
        ("latest", OPERATOR, "version 'latest'"),
        ("0.1", OPERATOR, "version '0.1'"),
        ("0.1.0-2026_12", OPERATOR, "version '0.1.0-2026_12'"),
        ("0.1.0", "Registry/Op:1", "operator image 'Registry/Op:1'"),
        ("0.1.0", "registry/op", "operator image 'registry/op'"),
        ("0.1.0", "registry/op@sha256:abc", "operator image 'registry/op@sha256:abc'"),
    ],
)
def test_a_bad_version_or_image_is_refused_by_name_before_anything_is_written(
    tmp_path: Path, version: str, operator: str, named: str
) -> None:
    release = release_catalog.Release(BUNDLE, version, operator, DAEMON)
    with pytest.raises(release_catalog.CatalogError, match=named.replace("@", ".")):
        release_catalog.stamp(release, tmp_path / "b", None)
    assert not (tmp_path / "b").exists()


def test_a_directory_without_a_csv_is_refused(tmp_path: Path) -> None:
    release = release_catalog.Release(tmp_path, "0.1.0", OPERATOR, DAEMON)
    with pytest.raises(release_catalog.CatalogError, match="has no manifests/"):
        release_catalog.stamp(release, tmp_path / "b", None)


def test_two_bundles_of_one_version_are_refused(tmp_path: Path) -> None:
    release = release_catalog.Release(BUNDLE, "0.1.0", OPERATOR, DAEMON)
    with pytest.raises(release_catalog.CatalogError, match="share a version"):
        release_catalog.build([release, release], tmp_path / "catalog")
    assert not (tmp_path / "catalog").exists()
