# Runs a release's `helm test` check from this machine, for clusters where the test
# Pod cannot run (no kubelet, as on the local control plane, or no image registry).
# It reads the release's test hooks (`helm get hooks`), creates the hooks that are not
# Pods (the test ServiceAccount and its RBAC), then runs each test Pod's kubectl
# command with the local kubectl, impersonating the Pod's ServiceAccount, so the same
# check runs with the same permissions. Exit status: that of the first failing check.
#
#   .venv/bin/python -m ops.helm_test [--release thunder-device-plugin]
#       [--namespace thunder-system] [--keep]
#
# KUBECONFIG, KUBECTL and HELM as for ops/deploy.py.
"""The chart's `helm test`, run from outside the cluster."""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import yaml

from ops.deploy import tool

HOOK: str = "helm.sh/hook"
WEIGHT: str = "helm.sh/hook-weight"


@dataclass(frozen=True, slots=True)
class CheckCommand:
    pod: str
    service_account: str
    argv: list[str]


def release_test_hooks(release: str, namespace: str) -> list[dict[str, Any]]:
    """The release's `test` hooks, in the order Helm creates them (by weight)."""
    out = subprocess.run(
        [tool("helm"), "get", "hooks", release, "--namespace", namespace],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    hooks = [d for d in yaml.safe_load_all(out) if d]
    tests = [
        h
        for h in hooks
        if "test" in str(h["metadata"].get("annotations", {}).get(HOOK, "")).split(",")
    ]
    return sorted(tests, key=lambda h: int(h["metadata"]["annotations"].get(WEIGHT, "0")))


def commands(hooks: list[dict[str, Any]]) -> list[CheckCommand]:
    """What each test Pod runs; only kubectl commands can be run from here."""
    found = []
    for pod in (h for h in hooks if h["kind"] == "Pod"):
        spec = pod["spec"]
        for container in spec["containers"]:
            argv = [*container.get("command", []), *container.get("args", [])]
            if not argv or argv[0].rsplit("/", 1)[-1] != "kubectl":
                raise SystemExit(
                    f"test Pod {pod['metadata']['name']} runs {argv[:1]}, not kubectl: "
                    "it can only run in the cluster (helm test)"
                )
            found.append(
                CheckCommand(
                    pod=pod["metadata"]["name"],
                    service_account=spec.get("serviceAccountName", "default"),
                    argv=argv[1:],
                )
            )
    return found


def run(release: str, namespace: str, keep: bool = False) -> int:
    hooks = release_test_hooks(release, namespace)
    if not hooks:
        print(f"release {release} has no test hooks", file=sys.stderr)
        return 1
    support = [h for h in hooks if h["kind"] != "Pod"]
    kubectl = tool("kubectl")
    docs = yaml.safe_dump_all(support)
    if support:
        subprocess.run(
            [kubectl, "apply", "--server-side", "--namespace", namespace, "-f", "-"],
            input=docs,
            check=True,
            text=True,
            capture_output=True,
        )
    status = 0
    try:
        for cmd in commands(hooks):
            who = f"system:serviceaccount:{namespace}:{cmd.service_account}"
            print(f"--- {cmd.pod}: kubectl {' '.join(cmd.argv)}  (as {who})", flush=True)
            done = subprocess.run(
                [kubectl, f"--as={who}", "--namespace", namespace, *cmd.argv], check=False
            )
            print(f"--- {cmd.pod}: {'passed' if done.returncode == 0 else 'FAILED'}", flush=True)
            if done.returncode and not status:
                status = done.returncode
    finally:
        if support and not keep:
            subprocess.run(
                [kubectl, "delete", "--namespace", namespace, "--ignore-not-found", "-f", "-"],
                input=docs,
                check=False,
                text=True,
                capture_output=True,
            )
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--release", default="thunder-device-plugin")
    parser.add_argument("--namespace", default="thunder-system")
    parser.add_argument("--keep", action="store_true", help="keep the test ServiceAccount/RBAC")
    args = parser.parse_args(argv)
    return run(args.release, args.namespace, args.keep)


if __name__ == "__main__":
    sys.exit(main())
