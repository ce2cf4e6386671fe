"""Rendering the project's charts with the project's helm, for the packaging tests."""

from __future__ import annotations

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


def render(
    *args: str, chart: Path = CHART, release: str = "tdp", namespace: str = NAMESPACE
) -> Manifests:
    done = subprocess.run(
        [helm(), "template", release, str(chart), "--namespace", namespace, *args],
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RenderError(done.stderr.strip())
    return Manifests([d for d in yaml.safe_load_all(done.stdout) if d])


def kustomize(directory: Path) -> Manifests:
    out = subprocess.run(
        [kubectl(), "kustomize", str(directory)], check=True, capture_output=True, text=True
    ).stdout
    return Manifests([d for d in yaml.safe_load_all(out) if d])


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}
