"""The fake ``libthunder.so``: ``libthunder.c`` here, built by the machine's C compiler.

The fake artifact host serves these bytes and its installer pins their SHA-256, so a
workload that preloads them shows in its own output that the dynamic loader loaded the
library and that it read the claim's ``config.json`` (``libthunder.c`` says what it
prints). The build targets the machine the tests run on, which is the node's machine.

Builds are cached under ``${XDG_CACHE_HOME:-~/.cache}/thunder-dra/fake-libthunder/<key>/``,
keyed by the source, the flags and the compiler's version and target, so a source or
compiler change builds afresh and every process (the fake service, the tests) reads the
same bytes. The compiler is ``$CC``, else ``cc``, else ``gcc``; when none is installed it
is installed with apt-get as root, else the build fails saying so.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).with_name("libthunder.c")
FLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra")
LIBRARY_NAME = "libthunder.so"
# What the constructor's line starts with, and how the dynamic loader says it refused a
# preload ("ERROR: ld.so: object '...' from LD_PRELOAD cannot be preloaded (...): ignored.").
PRELOADED_LINE = "libthunder (fake): preloaded into "
LOADER_ERROR = "from LD_PRELOAD cannot be preloaded"


def default_cache() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "thunder-dra" / "fake-libthunder"


class LibraryBuildError(RuntimeError):
    """The fake library could not be built (the message says why, with the compiler's)."""


@dataclass(frozen=True)
class Compiler:
    path: str
    identity: str  # its version and target, part of the cache key

    @classmethod
    def find(cls, *, install: bool = True) -> Compiler:
        path = _compiler_path()
        if path is None and install:
            _install_gcc()
            path = _compiler_path()
        if path is None:
            raise LibraryBuildError(
                "no C compiler ($CC, cc or gcc) to build the fake libthunder.so; install gcc"
            )
        version = _run([path, "--version"]).splitlines()[0]
        target = _run([path, "-dumpmachine"]).strip()
        return cls(path, f"{version}\n{target}")


def _compiler_path() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        found = shutil.which(name) if name else None
        if found:
            return found
    return None


def _install_gcc() -> None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "gcc", "libc6-dev"]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
        done = subprocess.run(install, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise LibraryBuildError(f"apt-get could not install gcc:\n{done.stdout[-2000:]}")


def _run(argv: list[str], cwd: str | None = None) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
    except OSError as err:
        raise LibraryBuildError(f"{' '.join(argv)} failed: {err}") from None
    if done.returncode != 0:
        raise LibraryBuildError(f"{' '.join(argv)} failed:\n{done.stderr.strip()}")
    return done.stdout


def cache_key(source: bytes, compiler: Compiler) -> str:
    material = b"\0".join([source, " ".join(FLAGS).encode(), compiler.identity.encode()])
    return hashlib.sha256(material).hexdigest()[:16]


def build_library(
    *, cache: Path | None = None, source: Path = SOURCE, compiler: Compiler | None = None
) -> Path:
    """The built library's path in the cache, compiling it first on a cache miss.

    Concurrent builders agree: each compiles into its own temporary file and links it
    into place only when no build is there yet, then everyone reads the one in place.
    """
    compiler = compiler or Compiler.find()
    text = source.read_bytes()
    folder = (cache or default_cache()) / cache_key(text, compiler)
    target = folder / LIBRARY_NAME
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".build-") as work:
        # Compile a copy of the bytes hashed, so the cache key names exactly what was
        # built, by a relative name, so the temporary folder's name is not in the output.
        (Path(work) / SOURCE.name).write_bytes(text)
        _run([compiler.path, *FLAGS, "-o", LIBRARY_NAME, SOURCE.name], cwd=work)
        with contextlib.suppress(FileExistsError):
            os.link(Path(work) / LIBRARY_NAME, target)
    return target


@functools.cache
def library() -> bytes:
    """The fake library's bytes, built (or found in the cache) once per process."""
    return build_library().read_bytes()


def library_sha256() -> str:
    return hashlib.sha256(library()).hexdigest()


def preloaded_lines(output: str) -> list[str]:
    """The constructor's lines in a workload's output: one per process that loaded it."""
    return [line for line in output.splitlines() if line.startswith(PRELOADED_LINE)]


def loader_errors(output: str) -> list[str]:
    """The dynamic loader's refusals of a preload in a workload's output."""
    return [line for line in output.splitlines() if LOADER_ERROR in line]
