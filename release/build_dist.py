# Builds the wheel and sdist of thunder-device-plugin into dist/, with the version
# stamped: $BUILD_VERSION when set (a release), otherwise the pyproject version with the
# commit as a local label (0.1.0+g1a2b3c4, .dirty when the tree has changes).
#
#   .venv/bin/python -m release.build_dist                 # make build
#   BUILD_VERSION=0.2.0 .venv/bin/python -m release.build_dist   # a release build
#
# The package reports the stamped version (thunder_dra.__version__, the Thunder API
# User-Agent). It builds from a copy of the sources, so the tree is left untouched.
"""Wheel and sdist with a stamped version."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[1]
SOURCES: Final = ("pyproject.toml", "README.md", "thunder_dra")
_VERSION_LINE: Final = re.compile(r'^version = "([^"]+)"$', re.MULTILINE)
_PEP440: Final = re.compile(
    r"^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?(\+[a-z0-9.]+)?$"
)


def project_version() -> str:
    match = _VERSION_LINE.search((REPO / "pyproject.toml").read_text())
    if match is None:
        raise SystemExit("pyproject.toml has no version line")
    return match.group(1)


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def stamped_version() -> str:
    explicit = os.environ.get("BUILD_VERSION", "").strip()
    if explicit:
        return explicit
    base = project_version()
    sha = _git("rev-parse", "--short=7", "HEAD")
    if not sha:
        return base
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return f"{base}+g{sha}{'.dirty' if dirty else ''}"


def _copy_sources(dest: Path, version: str) -> None:
    for name in SOURCES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    pyproject = dest / "pyproject.toml"
    text, count = _VERSION_LINE.subn(f'version = "{version}"', pyproject.read_text(), count=1)
    if count != 1:
        raise SystemExit("could not stamp the version into pyproject.toml")
    pyproject.write_text(text)


def build(out: Path, version: str) -> list[Path]:
    if not _PEP440.match(version):
        raise SystemExit(f"BUILD_VERSION {version!r} is not a PEP 440 version, e.g. 0.2.0rc1")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="thunder-build-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        _copy_sources(src, version)
        # setuptools' PEP 517 backend, run in this interpreter (no build isolation:
        # the pinned setuptools of the virtualenv is the one used).
        names = []
        for hook in ("build_sdist", "build_wheel"):
            code = f"import sys, setuptools.build_meta as b; print(b.{hook}(sys.argv[1]))"
            done = subprocess.run(
                [sys.executable, "-c", code, str(out.resolve())],
                cwd=src,
                check=True,
                capture_output=True,
                text=True,
            )
            names.append(done.stdout.strip().splitlines()[-1])
    return [out / name for name in names]


def wheel_version(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        for line in archive.read(meta).decode().splitlines():
            if line.startswith("Version: "):
                return line.removeprefix("Version: ")
    raise SystemExit(f"{wheel} has no Version in its METADATA")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO / "dist")
    args = parser.parse_args(argv)
    version = stamped_version()
    artifacts = build(args.out, version)
    wheel = next(p for p in artifacts if p.suffix == ".whl")
    if wheel_version(wheel) != version:
        raise SystemExit(f"{wheel} says {wheel_version(wheel)}, expected {version}")
    for path in artifacts:
        print(path.relative_to(REPO) if path.is_relative_to(REPO) else path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
