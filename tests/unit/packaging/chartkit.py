"""Rendering the project's charts with the project's helm, for the packaging tests.

A `helm template` or `kubectl kustomize` costs a process and most of a second on a busy
machine, and many tests render the same thing (the defaults above all), so each distinct
rendering runs once per test session: the key is the command line and the content of
every file it can read (the chart or kustomize tree, and any values file named in the
arguments), so an edit to any of them renders again. Every caller gets its own deep
copy, free to change. The output is parsed with libyaml when PyYAML has it (the same
documents, a tenth of the time).
"""

from __future__ import annotations

import copy
import hashlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hack.cluster import binaries

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "thunder-device-plugin"
POD_CHART = REPO / "charts" / "tests" / "pod"
VM_CHART = REPO / "charts" / "tests" / "vm"
NAMESPACE = "thunder-system"


def helm() -> str:
    return str(binaries() / "helm")


def kubectl() -> str:
    return str(binaries() / "kubectl")


class RenderError(AssertionError):
    """helm template failed; the message is helm's."""


@dataclass(frozen=True)
class Manifests:
    objects: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [o for o in self.of_kind(kind) if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
        return found[0]

    def kinds(self) -> set[str]:
        return {o["kind"] for o in self.objects}


_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_RENDERED: dict[tuple[Any, ...], list[dict[str, Any]] | RenderError] = {}


def _documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(text, Loader=_Loader) if d]


def _tree_digest(root: Path) -> str:
    """A digest of every file under `root` (names and contents), or of the file itself."""
    digest = hashlib.sha256()
    if root.is_file():
        digest.update(root.read_bytes())
        return digest.hexdigest()
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = Path(folder, name)
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _files_named(args: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(path, digest) of each existing file an argument names (`-f x`, `--set-file k=x`)."""
    named = []
    for arg in args:
        for candidate in {arg, arg.rpartition("=")[2]}:
            if candidate and os.path.isfile(candidate):
                named.append((candidate, _tree_digest(Path(candidate))))
    return tuple(named)


def _cached(key: tuple[Any, ...], run: Any) -> Manifests:
    if key not in _RENDERED:
        _RENDERED[key] = run()
    found = _RENDERED[key]
    if isinstance(found, RenderError):
        raise RenderError(*found.args)
    return Manifests(copy.deepcopy(found))


def render(
    *args: str, chart: Path = CHART, release: str = "tdp", namespace: str = NAMESPACE
) -> Manifests:
    command = [helm(), "template", release, str(chart), "--namespace", namespace, *args]

    def run() -> list[dict[str, Any]] | RenderError:
        done = subprocess.run(command, check=False, capture_output=True, text=True)
        if done.returncode:
            return RenderError(done.stderr.strip())
        return _documents(done.stdout)

    key = ("helm", tuple(command), _tree_digest(chart), _files_named(args))
    return _cached(key, run)


def kustomize(directory: Path) -> Manifests:
    command = [kubectl(), "kustomize", str(directory)]

    def run() -> list[dict[str, Any]]:
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        return _documents(out)

    # A kustomization may pull in its sibling folders: key on the whole config tree.
    config = REPO / "config"
    scope = config if directory.resolve().is_relative_to(config) else directory
    return _cached(("kustomize", tuple(command), _tree_digest(scope)), run)


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}
