# Offline and local-control-plane verification of everything the project ships for
# installation (make verify):
#   1. helm lint of the chart and the test charts;
#   2. the chart rendered with its defaults, with every values file in examples/ and
#      with every prometheus-operator object on, the test charts as the seed uses them,
#      config/default, config/samples and config/prometheus/monitors;
#   3. the CRDs in charts/, config/ and bundle/ byte-identical to crds/;
#   4. the chart README, bundle/ and the admission policies generated from
#      thunder_dra/kube/admissionpolicy.py up to date; the bundle passing the
#      operator-framework validators (release/build-bundle-validate.sh);
#   5. every rendered manifest through `kubectl apply --server-side --dry-run=server
#      --validate=strict` on a throwaway local control plane per version (1.34
#      emulated and 1.37), after creating the namespaces, CRDs and ServiceAccounts
#      for real.
# The prometheus-operator kinds are checked against that project's own CRDs, of the
# release hack/tools/prometheus-operator pins (hack/monitoring_crds.py). Kinds whose CRDs
# belong to other projects (cert-manager, KubeVirt) get permissive stand-in CRDs there,
# so only their metadata is checked; the report says so.
#
#   .venv/bin/python -m release.verify [--versions 1.34,1.37] [--skip-cluster]
"""make verify: render, compare, validate and server-side dry-run everything."""

from __future__ import annotations

import argparse
import filecmp
import functools
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from hack import monitoring_crds
from hack.cluster import Cluster, ClusterConfig, binaries
from release import bundle, helm_docs
from thunder_dra.kube import admissionpolicy

REPO: Final = Path(__file__).resolve().parents[1]
CHART: Final = REPO / "charts" / "thunder-device-plugin"
TEST_CHARTS: Final = {
    "pod": REPO / "charts" / "tests" / "pod",
    "vm": REPO / "charts" / "tests" / "vm",
}
NAMESPACE: Final = "thunder-system"
WORKLOAD_NAMESPACE: Final = "thunder-test"
# Third-party kinds the chart and test charts may render: (group, version, kind,
# plural, scope). Their real schemas are not available here; prometheus-operator's are
# (hack.monitoring_crds).
STAND_INS: Final = (
    ("cert-manager.io", "v1", "Certificate", "certificates", "Namespaced"),
    ("cert-manager.io", "v1", "Issuer", "issuers", "Namespaced"),
    ("kubevirt.io", "v1", "VirtualMachine", "virtualmachines", "Namespaced"),
)


@dataclass(frozen=True, slots=True)
class Rendered:
    name: str
    namespace: str
    text: str


class Failure(Exception):
    pass


def _run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=False, capture_output=True, text=True, **kwargs)


def _tool(name: str) -> str:
    return str(binaries() / name)


def step(title: str, fn: Callable[[], list[str]], failures: list[str]) -> None:
    print(f"==> {title}", flush=True)
    try:
        notes = fn()
    except Failure as err:
        print(f"    FAILED: {err}", flush=True)
        failures.append(f"{title}: {err}")
        return
    for note in notes:
        print(f"    {note}", flush=True)


def lint() -> list[str]:
    notes = []
    for chart in (CHART, *TEST_CHARTS.values()):
        done = _run([_tool("helm"), "lint", "--strict", str(chart)])
        if done.returncode:
            raise Failure(f"helm lint {chart.relative_to(REPO)}:\n{done.stdout}{done.stderr}")
        notes.append(f"helm lint --strict {chart.relative_to(REPO)}: ok")
    return notes


def helm_template(chart: Path, release: str, namespace: str, *args: str) -> str:
    done = _run([_tool("helm"), "template", release, str(chart), "--namespace", namespace, *args])
    if done.returncode:
        raise Failure(f"helm template {chart.relative_to(REPO)} {' '.join(args)}: {done.stderr}")
    return done.stdout


def renders() -> list[Rendered]:
    out = [Rendered("chart (defaults)", NAMESPACE, helm_template(CHART, "tdp", NAMESPACE))]
    for example in sorted((CHART / "examples").glob("*.yaml")):
        text = helm_template(CHART, "tdp", NAMESPACE, "-f", str(example))
        out.append(Rendered(f"chart + examples/{example.name}", NAMESPACE, text))
    monitoring = ("serviceMonitor", "podMonitor", "prometheusRule")
    args = [a for m in monitoring for a in ("--set", f"metrics.{m}.enabled=true")]
    out.append(
        Rendered(
            "chart + every prometheus-operator object",
            NAMESPACE,
            helm_template(CHART, "tdp", NAMESPACE, *args),
        )
    )
    out.append(
        Rendered(
            "charts/tests/pod (gpu.type=A6000, gpu.count=2)",
            WORKLOAD_NAMESPACE,
            helm_template(
                TEST_CHARTS["pod"],
                "thunder-pod",
                WORKLOAD_NAMESPACE,
                "--set",
                "gpu.type=A6000",
                "--set",
                "gpu.count=2",
            ),
        )
    )
    out.append(
        Rendered(
            "charts/tests/vm (gpu.type=A6000, gpu.count=1)",
            WORKLOAD_NAMESPACE,
            helm_template(
                TEST_CHARTS["vm"],
                "thunder-vm",
                WORKLOAD_NAMESPACE,
                "--set",
                "gpu.type=A6000",
                "--set",
                "gpu.count=1",
            ),
        )
    )
    for overlay in ("default", "samples", "prometheus/monitors"):
        done = _run([_tool("kubectl"), "kustomize", str(REPO / "config" / overlay)])
        if done.returncode:
            raise Failure(f"kubectl kustomize config/{overlay}: {done.stderr}")
        out.append(Rendered(f"config/{overlay}", NAMESPACE, done.stdout))
    return out


def render_all() -> list[str]:
    return [f"{r.name}: {len(_docs(r.text))} objects" for r in renders()]


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def crd_copies() -> list[str]:
    wanted = sorted((REPO / "crds").glob("*.yaml"))
    if not wanted:
        raise Failure("crds/ holds no CRDs")
    problems = []
    for target in (
        CHART / "crds",
        REPO / "config" / "crd" / "bases",
        REPO / "bundle" / "manifests",
    ):
        for source in wanted:
            copy = target / source.name
            if not copy.exists() or not filecmp.cmp(source, copy, shallow=False):
                problems.append(str(copy.relative_to(REPO)))
    if problems:
        raise Failure("differ from crds/ (run `make sync-crds`): " + ", ".join(problems))
    return [f"{len(wanted)} CRDs identical in charts/, config/ and bundle/"]


def docs_and_bundle() -> list[str]:
    if helm_docs.main(["--check"]) != 0:
        raise Failure("charts/thunder-device-plugin/README.md is stale (make helm-docs)")
    if bundle.main(["--check"]) != 0:
        raise Failure("bundle/ is stale (make bundle)")
    if admissionpolicy.main(["--check"]) != 0:
        raise Failure("admission policies are stale (python -m thunder_dra.kube.admissionpolicy)")
    tool = _run([str(REPO / "release" / "build-bundle-validate.sh")])
    if tool.returncode:
        raise Failure(f"building bundle-validate: {tool.stderr}")
    done = _run([tool.stdout.strip(), "-warnings-as-errors", str(REPO / "bundle")])
    if done.returncode:
        raise Failure(f"bundle validation:\n{done.stdout}{done.stderr}")
    return [line for line in done.stdout.splitlines() if line.strip()]


def _stand_in(group: str, version: str, kind: str, plural: str, scope: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "scope": scope,
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


def dry_run(version: str, rendered: list[Rendered]) -> list[str]:
    notes = []
    with tempfile.TemporaryDirectory(prefix="thunder-verify-") as tmp:
        config = ClusterConfig(emulated_version=None if version == "1.37" else version)
        with Cluster(workdir=Path(tmp) / "plane", config=config) as plane:
            env = plane.env()

            def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
                return _run(
                    [_tool("kubectl"), f"--kubeconfig={env['KUBECONFIG']}", *args], input=stdin
                )

            setup: list[dict[str, Any]] = [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                for ns in (NAMESPACE, WORKLOAD_NAMESPACE)
            ]
            setup += [_stand_in(*s) for s in STAND_INS]
            try:
                monitoring = list(monitoring_crds.crd_paths().values())
            except monitoring_crds.MonitoringCRDError as err:
                raise Failure(f"prometheus-operator CRDs: {err}") from err
            crd_files = sorted((REPO / "crds").glob("*.yaml")) + monitoring
            for doc in setup:
                done = kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(doc))
                if done.returncode:
                    raise Failure(f"creating {doc['kind']}: {done.stderr}")
            for path in crd_files:
                done = kubectl("apply", "--server-side", "-f", str(path))
                if done.returncode:
                    raise Failure(f"creating CRD {path.name}: {done.stderr}")
            done = kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
            if done.returncode:
                raise Failure(f"CRDs not established: {done.stderr}")
            problems = []
            for item in rendered:
                docs = _docs(item.text)
                # ServiceAccounts that Pods name must exist for real for their dry-run.
                for obj in docs:
                    if obj["kind"] == "ServiceAccount":
                        meta = obj["metadata"]
                        kubectl(
                            "create",
                            "serviceaccount",
                            meta["name"],
                            "-n",
                            meta.get("namespace", item.namespace),
                        )
                done = kubectl(
                    "apply",
                    "--server-side",
                    "--dry-run=server",
                    "--validate=strict",
                    "--namespace",
                    item.namespace,
                    "-f",
                    "-",
                    stdin=item.text,
                )
                if done.returncode:
                    problems.append(f"{item.name}:\n{done.stderr.strip()}")
                    continue
                stand_in = sorted({d["kind"] for d in docs} & {s[2] for s in STAND_INS})
                extra = f" ({', '.join(stand_in)}: metadata only)" if stand_in else ""
                notes.append(f"{version}: {item.name}: {len(docs)} objects accepted{extra}")
            if problems:
                raise Failure(f"server-side dry-run at {version}:\n" + "\n".join(problems))
    return notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--versions", default="1.34,1.37")
    parser.add_argument("--skip-cluster", action="store_true", help="no control plane steps")
    args = parser.parse_args(argv)
    failures: list[str] = []
    step("helm lint", lint, failures)
    step("render the chart, its examples, the test charts and config/", render_all, failures)
    step("CRD copies", crd_copies, failures)
    step("chart README, bundle and its validation", docs_and_bundle, failures)
    if not args.skip_cluster and not failures:
        rendered = renders()
        for version in [v.strip() for v in args.versions.split(",") if v.strip()]:
            step(
                f"server-side dry-run on a local control plane at {version}",
                functools.partial(dry_run, version, rendered),
                failures,
            )
    if failures:
        print(f"\nverify FAILED ({len(failures)} step(s))", file=sys.stderr)
        return 1
    print("\nverify passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
