"""The last release: the pinned earlier commit's tree and images, for the upgrade tests.

``release/last-release`` names the commit and its version, the one place they live; each
release replaces them with its own (docs/releasing.md). ``last_release()`` takes that
commit's tree out of this clone's git history (``git archive``) into
``${XDG_CACHE_HOME:-~/.cache}/thunder-dra/last-release/<commit>/`` and builds its operator
and daemon images with its own image builder (``python -m hack.image build`` run in that
tree). Both are cached: the tree by commit, built in a temporary directory and renamed, and
the images by content in the image cache ``make image`` shares, so a second call builds
nothing.

    python -m hack.node.last_release     # materialize and build; print the paths
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hack.image import BuiltImage

REPO = Path(__file__).resolve().parents[2]
PIN = REPO / "release" / "last-release"
CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    / "thunder-dra"
    / "last-release"
)
CHART = Path("charts") / "thunder-device-plugin"
COMPONENTS = ("operator", "daemon")


class LastReleaseError(RuntimeError):
    """The pin is unreadable, its commit is not in this clone, or its images did not build."""


@dataclass(frozen=True)
class LastRelease:
    """The pinned commit's tree, the install sources in it, and its images."""

    commit: str
    version: str
    tree: Path
    chart: Path
    crds: Path
    bundle: Path
    readme: Path
    images: dict[str, BuiltImage]


def pinned(pin: Path = PIN) -> tuple[str, str]:
    """The commit and the version ``release/last-release`` names."""
    fields: dict[str, str] = {}
    for line in pin.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) == 2:
            fields[words[0]] = words[1]
        elif words:
            raise LastReleaseError(f"{pin}: expected '<key> <value>', got {line!r}")
    commit, version = fields.get("commit", ""), fields.get("version", "")
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise LastReleaseError(f"{pin}: 'commit' must be a full 40-digit sha, got {commit!r}")
    if not version:
        raise LastReleaseError(f"{pin}: no 'version'")
    return commit, version


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=False)


def materialize(commit: str) -> Path:
    """The commit's tree under the cache, taken from this clone's history once."""
    target = CACHE / commit
    if target.is_dir():
        return target
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        shallow = _git("rev-parse", "--is-shallow-repository").stdout.decode().strip()
        hint = " (this clone is shallow: git fetch --unshallow)" if shallow == "true" else ""
        raise LastReleaseError(
            f"the last release's commit {commit} ({PIN.relative_to(REPO)}) is not in the "
            f"clone at {REPO}{hint}"
        )
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=CACHE, prefix=f".{commit[:12]}-"))
    try:
        archive = _git("archive", "--format=tar", commit)
        if archive.returncode != 0:
            raise LastReleaseError(f"git archive {commit}: {archive.stderr.decode()}")
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
        try:
            tmp.rename(target)
        except OSError:
            if not target.is_dir():
                raise
            # Another process materialized it meanwhile: the same content.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def build_images(tree: Path) -> dict[str, BuiltImage]:
    """The tree's operator and daemon images, built by the tree's own image builder."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "hack.image", "build"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise LastReleaseError(
            f"building the images of {tree.name} failed ({done.returncode}):\n{done.stderr[-3000:]}"
        )
    images: dict[str, BuiltImage] = {}
    for line in done.stdout.splitlines():
        found = re.fullmatch(r"(\w+)=(\S+) (\S+)", line.strip())
        if found and found.group(1) in COMPONENTS:
            component, ref, archive = found.groups()
            images[component] = BuiltImage(component, ref, Path(archive))
    missing = [c for c in COMPONENTS if c not in images or not images[c].archive.is_file()]
    if missing:
        raise LastReleaseError(f"the image build of {tree.name} made no {missing}: {done.stdout}")
    return images


def last_release() -> LastRelease:
    """The pinned last release: its tree materialized and its images built (cached)."""
    commit, version = pinned()
    tree = materialize(commit)
    found = re.search(r'^version = "(.*)"', (tree / "pyproject.toml").read_text(), re.M)
    if found is None or found.group(1) != version:
        raise LastReleaseError(
            f"{PIN.relative_to(REPO)} names version {version}; commit {commit} carries "
            f"{found.group(1) if found else 'none'}"
        )
    chart = tree / CHART
    return LastRelease(
        commit=commit,
        version=version,
        tree=tree,
        chart=chart,
        crds=chart / "crds",
        bundle=tree / "bundle",
        readme=tree / "README.md",
        images=build_images(tree),
    )


def main() -> int:
    try:
        release = last_release()
    except LastReleaseError as err:
        print(f"last release: {err}", file=sys.stderr)
        return 2
    print(f"commit={release.commit} version={release.version}")
    print(f"tree={release.tree}")
    for component, image in release.images.items():
        print(f"{component}={image.ref} {image.archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
