"""Generate the CRDs in crds/ from the models.

    python -m thunder_dra.api.crdgen [--out crds/]   # write
    python -m thunder_dra.api.crdgen --check          # exit 1 if crds/ drifted

The models are the single source of truth; a unit test runs the check, so a model
change without regenerated CRDs fails CI.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import yaml
from pydantic import BaseModel

from thunder_dra.api.client import ClientSpec, ClientStatus
from thunder_dra.api.constants import (
    APP_NAME,
    CLIENT_KIND,
    CLIENT_PLURAL,
    GROUP,
    THUNDER_CLUSTER_KIND,
    THUNDER_CLUSTER_PLURAL,
    VERSION,
)
from thunder_dra.api.schema import strip_defaults, structural_schema
from thunder_dra.api.thundercluster import ThunderClusterSpec, ThunderClusterStatus

DEFAULT_OUT: Final = Path("crds")
HEADER: Final = (
    "# Generated from the models in thunder_dra/api by `python -m thunder_dra.api.crdgen`.\n"
    "# Do not edit: change the models and regenerate.\n"
)


@dataclass(frozen=True, slots=True)
class PrinterColumn:
    name: str
    json_path: str
    type: Literal["string", "integer", "number", "boolean", "date"] = "string"
    description: str = ""
    priority: int = 0

    def to_json(self) -> dict[str, Any]:
        column: dict[str, Any] = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.description:
            column["description"] = self.description
        if self.priority:
            column["priority"] = self.priority
        return column


@dataclass(frozen=True, slots=True)
class CrdDefinition:
    """What a CRD is made of besides its models."""

    kind: str
    plural: str
    scope: Literal["Cluster", "Namespaced"]
    description: str
    spec_model: type[BaseModel]
    status_model: type[BaseModel]
    spec_required: bool
    short_names: tuple[str, ...]
    columns: tuple[PrinterColumn, ...]
    categories: tuple[str, ...] = field(default=("thunder",))

    @property
    def name(self) -> str:
        return f"{self.plural}.{GROUP}"

    @property
    def file_name(self) -> str:
        return f"{self.name}.yaml"


_AGE = PrinterColumn("Age", ".metadata.creationTimestamp", "date")

THUNDER_CLUSTER_CRD: Final = CrdDefinition(
    kind=THUNDER_CLUSTER_KIND,
    plural=THUNDER_CLUSTER_PLURAL,
    scope="Cluster",
    description=(
        "ThunderCluster holds every runtime setting of the Thunder DRA driver. "
        "One per cluster; the operator reconciles it into ResourceSlices, DeviceClasses "
        "and the daemon DaemonSet."
    ),
    spec_model=ThunderClusterSpec,
    status_model=ThunderClusterStatus,
    spec_required=False,
    short_names=("tcluster",),
    columns=(
        PrinterColumn("Ready", '.status.conditions[?(@.type=="Ready")].status'),
        PrinterColumn("Pools", ".status.poolCount", "integer", "Pools published"),
        PrinterColumn("Devices", ".status.deviceCount", "integer", "Devices published"),
        PrinterColumn("Last Sync", ".status.lastSyncTime", "date", "Last inventory pass"),
        _AGE,
        PrinterColumn("Reason", '.status.conditions[?(@.type=="Ready")].reason', priority=1),
    ),
)

CLIENT_CRD: Final = CrdDefinition(
    kind=CLIENT_KIND,
    plural=CLIENT_PLURAL,
    scope="Namespaced",
    description=(
        "Client records one Thunder enrollment made for one ResourceClaim. Its finalizer "
        "holds it until the enrollment is revoked."
    ),
    spec_model=ClientSpec,
    status_model=ClientStatus,
    spec_required=True,
    short_names=("tclient",),
    columns=(
        PrinterColumn("Claim", ".spec.claim.name", description="ResourceClaim name"),
        PrinterColumn("Node", ".spec.nodeName"),
        PrinterColumn("Zone", ".spec.zone.name"),
        PrinterColumn("Type", ".spec.gpuType", description="GPU model"),
        PrinterColumn("Count", ".spec.gpuCount", "integer", "GPUs"),
        PrinterColumn("Phase", ".status.phase"),
        PrinterColumn("Client ID", ".status.clientId", priority=1),
        PrinterColumn("Consumer", ".spec.consumerKind", priority=1),
        PrinterColumn("Orphaned Since", ".status.orphanedSince", "date", priority=1),
        _AGE,
    ),
)

CRDS: Final = (THUNDER_CLUSTER_CRD, CLIENT_CRD)


def spec_schema(definition: CrdDefinition) -> dict[str, Any]:
    """The structural schema of the spec, with defaults the API server applies."""
    defaults = None
    if not definition.spec_required:
        # Every field has a default, so a fully defaulted instance exists.
        defaults = definition.spec_model().model_dump(mode="json", by_alias=True, exclude_none=True)
    return structural_schema(definition.spec_model, defaults=defaults)


def openapi_schema(definition: CrdDefinition) -> dict[str, Any]:
    """The whole openAPIV3Schema of the CRD's one version."""
    spec = spec_schema(definition)
    if not definition.spec_required:
        spec["default"] = {}
    status = strip_defaults(structural_schema(definition.status_model))
    root: dict[str, Any] = {
        "description": definition.description,
        "type": "object",
    }
    if definition.spec_required:
        root["required"] = ["spec"]
    root["properties"] = {
        "apiVersion": {"description": "APIVersion of the object.", "type": "string"},
        "kind": {"description": "Kind of the object.", "type": "string"},
        "metadata": {"type": "object"},
        "spec": spec,
        "status": status,
    }
    return root


def build_crd(definition: CrdDefinition) -> dict[str, Any]:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition as a JSON-ready dict."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": definition.name,
            "labels": {"app.kubernetes.io/name": APP_NAME},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": definition.kind,
                "listKind": f"{definition.kind}List",
                "plural": definition.plural,
                "singular": definition.kind.lower(),
                "shortNames": list(definition.short_names),
                "categories": list(definition.categories),
            },
            "scope": definition.scope,
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [c.to_json() for c in definition.columns],
                    "schema": {"openAPIV3Schema": openapi_schema(definition)},
                }
            ],
        },
    }


def render_crd(definition: CrdDefinition) -> str:
    """The CRD as the YAML text kept in crds/."""
    body = yaml.safe_dump(
        build_crd(definition), sort_keys=False, default_flow_style=False, width=100
    )
    return HEADER + body


def generated_files() -> dict[str, str]:
    """File name -> content of every generated CRD."""
    return {definition.file_name: render_crd(definition) for definition in CRDS}


def drifted(out_dir: Path) -> list[str]:
    """Names of the files in `out_dir` that are missing or differ from the models."""
    stale = []
    for name, text in generated_files().items():
        path = out_dir / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
    return stale


def write(out_dir: Path) -> list[Path]:
    """Write every CRD into `out_dir`; return the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in generated_files().items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m thunder_dra.api.crdgen", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the files differ from the models"
    )
    args = parser.parse_args(argv)
    if args.check:
        stale = drifted(args.out)
        for name in stale:
            print(f"{args.out / name} is out of date with thunder_dra/api", file=sys.stderr)
        if stale:
            print("regenerate with: python -m thunder_dra.api.crdgen", file=sys.stderr)
            return 1
        return 0
    for path in write(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
