# Builds an OLM file-based catalog of the project's bundle, for a CatalogSource that
# opm serves (``opm serve <catalog>``). Each bundle is stamped for a release first: its
# ClusterServiceVersion is renamed and versioned after the release tag
# (`<version>-<UTC time>`, as make push tags the images), names the images the release
# pushed, replaces the bundle before it in the channel and skips every earlier version
# (`olm.skipRange: <version`), so OLM upgrades along the chain, and from any earlier
# release to a catalog that holds only the newest. The catalog embeds each bundle's
# manifests (``opm render`` of the stamped directory), so OLM installs from the catalog
# alone, without unpacking a bundle image.
#
#   .venv/bin/python -m release.catalog --out dist/catalog --registry <registry> \
#       [--tag 0.1.0-20261202T120000Z]                                  (make catalog)
#
# names <registry>/thunder-device-plugin-operator:<tag> and <registry>/thunder-device-plugin:
# <tag>, the images make push pushed; the tag defaults to make push's (the project's
# version and the commit time of HEAD).
#
# opm comes from hack/build-olm.sh, or $OPM.
"""OLM file-based catalogs of stamped bundles (release.catalog)."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from hack import image as image_builder
from release import push as release_push
from release.bundle import BUNDLE, CHANNEL, PACKAGE, project_version

REPO: Final = Path(__file__).resolve().parents[1]
CSV_FILE: Final = f"{PACKAGE}.clusterserviceversion.yaml"
# A release version: semver with the UTC-time pre-release the release tags carry.
VERSION_RE: Final = re.compile(r"^\d+\.\d+\.\d+(-[0-9A-Za-z]+(\.[0-9A-Za-z]+)*)?$")
IMAGE_RE: Final = re.compile(r"^[a-z0-9][a-z0-9._:/-]*(@sha256:[0-9a-f]{64}|:[\w][\w.-]{0,127})$")


class CatalogError(ValueError):
    """A bundle, version or image a catalog cannot be made of; names the value."""


@dataclass(frozen=True)
class Release:
    """One bundle of the channel: the bundle directory and what its release pins."""

    bundle: Path
    version: str
    operator_image: str
    daemon_image: str

    @property
    def csv_name(self) -> str:
        # An object name is lowercase (RFC 1123); the tag's time has a T and a Z.
        return f"{PACKAGE}.v{self.version.lower()}"


def opm() -> str:
    explicit = os.environ.get("OPM")
    if explicit:
        return explicit
    built = subprocess.run(
        [str(REPO / "hack" / "build-olm.sh")], check=True, capture_output=True, text=True
    ).stdout.strip()
    return str(Path(built) / "bin" / "opm")


def _check(release: Release) -> None:
    if not VERSION_RE.match(release.version):
        raise CatalogError(f"version {release.version!r} is not <major>.<minor>.<patch>[-<pre>]")
    for field, image in (
        ("operator image", release.operator_image),
        ("daemon image", release.daemon_image),
    ):
        if not IMAGE_RE.match(image):
            raise CatalogError(f"{field} {image!r} is not <repository>:<tag> or @sha256:<digest>")
    if not (release.bundle / "manifests" / CSV_FILE).is_file():
        raise CatalogError(f"{release.bundle} has no manifests/{CSV_FILE}")


def _set_image(csv: dict[str, Any], release: Release) -> None:
    """Point the operator Deployment, relatedImages and the containerImage annotation at
    the release's images (the daemon image is what the operator's DaemonSet runs unless
    the ThunderCluster names one)."""
    strategy = csv["spec"]["install"]["spec"]
    found = 0
    for deployment in strategy.get("deployments", []):
        for container in deployment["spec"]["template"]["spec"].get("containers", []):
            if container.get("name") == "operator":
                container["image"] = release.operator_image
                found += 1
    if found != 1:
        raise CatalogError(f"{release.bundle}: the CSV has {found} operator containers, not 1")
    csv["metadata"].setdefault("annotations", {})["containerImage"] = release.operator_image
    csv["spec"]["relatedImages"] = [
        {"name": "operator", "image": release.operator_image},
        {"name": "daemon", "image": release.daemon_image},
    ]


def stamp(release: Release, out: Path, replaces: str | None) -> Path:
    """A copy of ``release.bundle`` in ``out`` whose CSV is named, versioned and imaged
    after ``release`` and replaces the CSV named ``replaces`` (none for the first)."""
    _check(release)
    shutil.copytree(release.bundle, out, ignore=shutil.ignore_patterns("bundle.Dockerfile"))
    path = out / "manifests" / CSV_FILE
    csv = yaml.safe_load(path.read_text())
    csv["metadata"]["name"] = release.csv_name
    csv["spec"]["version"] = release.version
    csv["spec"].pop("replaces", None)
    if replaces:
        csv["spec"]["replaces"] = replaces
    # Any earlier release upgrades to this one, in this catalog or not (a catalog of one
    # release, as make catalog writes, still upgrades a cluster running the last).
    csv["metadata"].setdefault("annotations", {})["olm.skipRange"] = f"<{release.version}"
    _set_image(csv, release)
    path.write_text(yaml.safe_dump(csv, sort_keys=False, width=100))
    return out


def _opm(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [opm(), *args], capture_output=True, text=True, cwd=cwd, check=False, timeout=300
    )
    if done.returncode != 0:
        raise CatalogError(f"opm {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def build(releases: Sequence[Release], out: Path) -> list[str]:
    """Write a validated file-based catalog of ``releases`` (oldest first, each replacing
    the one before) to ``out/<package>/catalog.yaml``; returns the channel's CSV names."""
    if not releases:
        raise CatalogError("a catalog needs at least one bundle")
    names = [r.csv_name for r in releases]
    if len(set(names)) != len(names):
        raise CatalogError(f"two bundles share a version: {names}")
    package_dir = out / PACKAGE
    package_dir.mkdir(parents=True, exist_ok=False)
    documents: list[dict[str, Any]] = []
    documents.append(
        yaml.safe_load(_opm("init", PACKAGE, f"--default-channel={CHANNEL}", "--output=yaml"))
    )
    entries: list[dict[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        previous: str | None = None
        for index, release in enumerate(releases):
            stamped = stamp(release, Path(tmp) / f"bundle-{index}", previous)
            rendered = list(yaml.safe_load_all(_opm("render", str(stamped), "--output=yaml")))
            documents += [d for d in rendered if d]
            entry = {"name": release.csv_name}
            if previous:
                entry["replaces"] = previous
            entries.append(entry)
            previous = release.csv_name
    documents.append(
        {"schema": "olm.channel", "package": PACKAGE, "name": CHANNEL, "entries": entries}
    )
    (package_dir / "catalog.yaml").write_text(
        yaml.safe_dump_all(documents, sort_keys=False, width=100)
    )
    _opm("validate", str(out))
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="catalog directory (new)")
    parser.add_argument("--bundle", type=Path, default=BUNDLE, help="bundle directory")
    parser.add_argument("--registry", required=True, help="where make push pushed the images")
    parser.add_argument("--tag", help="the images' tag, <version>-<UTC time> (make push's)")
    args = parser.parse_args(argv)
    if args.out.exists():
        print(f"{args.out} exists: a catalog is written to a new directory", file=sys.stderr)
        return 2
    tag = args.tag or release_push.default_tag(project_version())
    registry = args.registry.rstrip("/")
    release = Release(
        args.bundle,
        tag,
        f"{registry}/{image_builder.IMAGES['operator'][0]}:{tag}",
        f"{registry}/{image_builder.IMAGES['daemon'][0]}:{tag}",
    )
    try:
        names = build([release], args.out)
    except CatalogError as error:
        print(error, file=sys.stderr)
        return 1
    print(f"wrote {args.out} ({', '.join(names)}); serve it with: opm serve {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
