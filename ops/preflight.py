# Checks whether the cluster of the current kubeconfig can run thunder-device-plugin,
# and prints a readable report: Kubernetes version (1.34+), resource.k8s.io/v1 served,
# whether DeviceClass.spec.extendedResourceName survives a server-side dry-run (the
# DRAExtendedResource gate), KubeVirt present or not, serving nodes labelled with a
# zone, and the API token Secret. Changes nothing in the cluster.
#
#   .venv/bin/python -m ops.preflight [--context C] [--namespace thunder-system]
#       [--secret-name thunder-api] [--json]                         # make preflight
#
# Exit status: 0 when nothing failed (warnings allowed), 1 when a check failed.
"""Preflight checks of a cluster for thunder-device-plugin."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Final

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

MIN_MINOR: Final = 34
EXTENDED_RESOURCE_GA_MINOR: Final = 36
SERVING_LABEL: Final = "thundercompute.com/node"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"
CHECK_CLASS: Final = "thunder-extended-resource-check"
CHECK_RESOURCE: Final = "thundercompute.com/gpu"


class Status(StrEnum):
    OK = "ok"
    INFO = "info"
    WARN = "warn"
    FAIL = "fail"


@dataclass(slots=True)
class Check:
    name: str
    status: Status
    summary: str
    details: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Report:
    context: str
    server: str
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(c.status is Status.FAIL for c in self.checks)

    def get(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def to_json(self) -> dict[str, Any]:
        return {
            "context": self.context,
            "server": self.server,
            "failed": self.failed,
            "checks": [asdict(c) for c in self.checks],
        }


def request(
    api: client.ApiClient,
    method: str,
    path: str,
    query: list[tuple[str, str]] | None = None,
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A raw API call returning the JSON document; ApiException on a non-2xx answer."""
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    verb, url, all_headers, payload, post = api.param_serialize(
        method,
        path,
        query_params=query or [],
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(verb, url, header_params=all_headers, body=payload, post_params=post)
    data = response.read()  # type: ignore[no-untyped-call]
    if not 200 <= response.status < 300:
        raise ApiException(status=response.status, reason=response.reason, body=data)
    document: dict[str, Any] = json.loads(data)
    return document


def _minor(text: str) -> int:
    return int("".join(ch for ch in text if ch.isdigit()) or "0")


def check_version(api: client.ApiClient) -> tuple[Check, int]:
    info = request(api, "GET", "/version")  # the raw document, with the emulation fields
    git = str(info.get("gitVersion", "?"))
    minor = _minor(str(info.get("minor", "0")))
    emulated = info.get("emulationMinor")
    summary = f"Kubernetes {git}"
    if emulated and _minor(str(emulated)) != minor:
        minor = _minor(str(emulated))
        summary += f" emulating {info.get('emulationMajor', '1')}.{minor}"
    if minor < MIN_MINOR:
        return (
            Check(
                "kubernetes-version",
                Status.FAIL,
                summary,
                [f"thunder-device-plugin needs Kubernetes 1.{MIN_MINOR} or newer"],
            ),
            minor,
        )
    return Check("kubernetes-version", Status.OK, summary), minor


def check_resource_api(api: client.ApiClient) -> Check:
    try:
        found = request(api, "GET", "/apis/resource.k8s.io/v1")
    except ApiException as err:
        return Check(
            "resource.k8s.io/v1",
            Status.FAIL,
            "resource.k8s.io/v1 is not served",
            [f"discovery answered {err.status}: Dynamic Resource Allocation is GA from 1.34"],
        )
    names = {r["name"] for r in found.get("resources", [])}
    missing = sorted({"deviceclasses", "resourceslices", "resourceclaims"} - names)
    if missing:
        return Check(
            "resource.k8s.io/v1",
            Status.FAIL,
            "resource.k8s.io/v1 is served without " + ", ".join(missing),
        )
    return Check("resource.k8s.io/v1", Status.OK, "resource.k8s.io/v1 is served")


def check_extended_resource(api: client.ApiClient, minor: int) -> Check:
    """The seed's check: does extendedResourceName survive a server-side dry-run?"""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CHECK_CLASS},
        "spec": {
            "extendedResourceName": CHECK_RESOURCE,
            "selectors": [{"cel": {"expression": 'device.driver == "thundercompute.com"'}}],
        },
    }
    name = "extended-resources"
    try:
        created = request(
            api,
            "POST",
            "/apis/resource.k8s.io/v1/deviceclasses",
            query=[("dryRun", "All"), ("fieldValidation", "Strict")],
            body=body,
        )
    except ApiException as err:
        reason = err.reason or ""
        if err.status == 409:
            reason = f"a DeviceClass named {CHECK_CLASS} exists; delete it and retry"
        return Check(
            name,
            Status.WARN,
            "could not check extended resources (server-side dry-run refused)",
            [f"{err.status} {reason}".strip()],
        )
    kept = created.get("spec", {}).get("extendedResourceName") == CHECK_RESOURCE
    if kept:
        return Check(
            name,
            Status.OK,
            "extendedResourceName survives a server-side dry-run: "
            "resources.limits requests (thundercompute.com/gpu-<type>) work",
        )
    details = [
        "the API server dropped DeviceClass.spec.extendedResourceName: the "
        "DRAExtendedResource feature gate is off",
        "request GPUs with ResourceClaims, and install with "
        "--set operator.extendedResourcePrefix='' (or enable the gate on the API "
        "server, scheduler, controller-manager and every kubelet)",
    ]
    status = Status.WARN if minor < EXTENDED_RESOURCE_GA_MINOR else Status.FAIL
    if status is Status.FAIL:
        details.insert(1, f"it is on by default from 1.{EXTENDED_RESOURCE_GA_MINOR}")
    return Check(name, status, "extended resources unavailable (DRAExtendedResource off)", details)


def check_kubevirt(api: client.ApiClient) -> Check:
    try:
        found = request(api, "GET", "/apis/kubevirt.io/v1")
    except ApiException:
        return Check(
            "kubevirt",
            Status.INFO,
            "KubeVirt is not installed: only pods can use Thunder GPUs (VMs need KubeVirt + CDI)",
        )
    names = {r["name"] for r in found.get("resources", [])}
    if "virtualmachines" in names:
        return Check("kubevirt", Status.OK, "KubeVirt is installed (kubevirt.io/v1 serves VMs)")
    return Check("kubevirt", Status.WARN, "kubevirt.io/v1 is served without virtualmachines")


def check_serving_nodes(core: client.CoreV1Api) -> Check:
    nodes = core.list_node(label_selector=f"{SERVING_LABEL}=true").items
    name = "serving-nodes"
    if not nodes:
        return Check(
            name,
            Status.WARN,
            f"no node is labelled {SERVING_LABEL}=true: nothing serves GPUs yet",
            [
                f"kubectl label node <node> {SERVING_LABEL}=true",
                f"kubectl label node <node> {ZONE_LABEL}=<zone>",
            ],
        )
    zones: dict[str, list[str]] = {}
    unzoned: list[str] = []
    for node in nodes:
        meta = node.metadata or client.V1ObjectMeta()
        node_name = str(meta.name)
        zone = (meta.labels or {}).get(ZONE_LABEL)
        if zone:
            zones.setdefault(zone, []).append(node_name)
        else:
            unzoned.append(node_name)
    details = [f"zone {z}: {', '.join(sorted(n))}" for z, n in sorted(zones.items())]
    if unzoned:
        details += [f"no {ZONE_LABEL} label: {', '.join(sorted(unzoned))}"]
        details += [f"kubectl label node <node> {ZONE_LABEL}=<zone> (the daemon will not start)"]
        return Check(
            name,
            Status.FAIL,
            f"{len(unzoned)} of {len(nodes)} serving node(s) have no zone label",
            details,
        )
    return Check(
        name,
        Status.OK,
        f"{len(nodes)} serving node(s) in {len(zones)} zone(s), all labelled",
        details,
    )


def check_secret(core: client.CoreV1Api, namespace: str, secret: str) -> Check:
    name = "api-token-secret"
    try:
        found = core.read_namespaced_secret(secret, namespace)
    except ApiException as err:
        if err.status == 404:
            return Check(
                name,
                Status.WARN,
                f"Secret {namespace}/{secret} does not exist yet (create it before installing)",
                [
                    f"kubectl -n {namespace} create secret generic {secret} "
                    "--from-literal=THUNDER_API_TOKEN='<token>'"
                ],
            )
        return Check(name, Status.WARN, f"cannot read Secret {namespace}/{secret}: {err.status}")
    if "THUNDER_API_TOKEN" not in (found.data or {}):
        return Check(name, Status.FAIL, f"Secret {namespace}/{secret} has no THUNDER_API_TOKEN key")
    return Check(name, Status.OK, f"Secret {namespace}/{secret} holds THUNDER_API_TOKEN")


def run(
    context: str | None = None,
    namespace: str = "thunder-system",
    secret: str = "thunder-api",
    kubeconfig: str | None = None,
) -> Report:
    _, active = config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    chosen = context or (active or {}).get("name", "")
    api = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, context=chosen or None
    )
    report = Report(context=chosen, server=api.configuration.host)
    version, minor = check_version(api)
    report.checks.append(version)
    report.checks.append(check_resource_api(api))
    if report.get("resource.k8s.io/v1").status is not Status.FAIL:
        report.checks.append(check_extended_resource(api, minor))
    report.checks.append(check_kubevirt(api))
    core = client.CoreV1Api(api)
    report.checks.append(check_serving_nodes(core))
    report.checks.append(check_secret(core, namespace, secret))
    return report


_MARK: Final = {
    Status.OK: "[ ok ]",
    Status.INFO: "[info]",
    Status.WARN: "[warn]",
    Status.FAIL: "[FAIL]",
}


def format_report(report: Report) -> str:
    lines = [f"Preflight for context {report.context!r} ({report.server})", ""]
    for check in report.checks:
        lines.append(f"{_MARK[check.status]} {check.summary}")
        lines.extend(f"       {d}" for d in check.details)
    lines.append("")
    counts = {s: sum(c.status is s for c in report.checks) for s in Status}
    verdict = "NOT READY" if report.failed else "ready"
    lines.append(
        f"{verdict}: {counts[Status.OK]} ok, {counts[Status.WARN]} warnings, "
        f"{counts[Status.FAIL]} failed"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG)")
    parser.add_argument("--namespace", default="thunder-system")
    parser.add_argument("--secret-name", default="thunder-api")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    try:
        report = run(args.context, args.namespace, args.secret_name, args.kubeconfig)
    except (config.ConfigException, OSError) as err:
        print(f"preflight: cannot reach a cluster: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(format_report(report))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
