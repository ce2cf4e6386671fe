"""The chart's pre-delete hook: what `make uninstall` does before `helm uninstall`.

Runs in the operator image (its Python, the standard library only), as the hook's own
ServiceAccount, while the release's operator still runs:

1. Refuses while any clients.thundercompute.com exist: each holds a Thunder enrollment
   that only the running operator revokes (and then releases the Client's finalizer).
   Removing the driver now would strand them.
2. Deletes the release's ThunderCluster(s) (those whose Helm annotations name this
   release) and waits until they are gone: the operator stops its loops for each and
   releases its finalizer, thundercompute.com/operator.
3. Fails with what to do when that has not happened within the timeout.

Settings (environment): TDP_RELEASE, TDP_NAMESPACE, TDP_OPERATOR (the operator
Deployment, for the messages), TDP_TIMEOUT_SECONDS. The API server, token and CA are
the in-cluster ones; TDP_API_SERVER, TDP_TOKEN_FILE and TDP_CA_FILE override them (the
chart's tests run this file outside a Pod, with the hook ServiceAccount's token).
Exit status 0 when nothing of the release's is left to release, 1 otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from typing import Any

GROUP_VERSION = "thundercompute.com/v1alpha1"
OPERATOR_FINALIZER = "thundercompute.com/operator"
RELEASE_ANNOTATION = "meta.helm.sh/release-name"
NAMESPACE_ANNOTATION = "meta.helm.sh/release-namespace"
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
POLL_SECONDS = 2.0


class Refusal(Exception):
    """Why the release cannot be uninstalled yet, and what to do."""


class Api:
    def __init__(self) -> None:
        server = os.environ.get("TDP_API_SERVER", "")
        if not server:
            host = os.environ["KUBERNETES_SERVICE_HOST"]
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        if not server.startswith("https://"):
            raise Refusal(f"the API server must be reached over https, got {server!r}")
        self.server = server.rstrip("/")
        token_file = os.environ.get("TDP_TOKEN_FILE", f"{SERVICE_ACCOUNT}/token")
        with open(token_file, encoding="utf-8") as handle:
            self.token = handle.read().strip()
        ca_file = os.environ.get("TDP_CA_FILE", f"{SERVICE_ACCOUNT}/ca.crt")
        self.context = ssl.create_default_context(cafile=ca_file)

    def call(self, method: str, path: str) -> tuple[int, Any]:
        """(status, parsed body); a 404 is returned, any other error raised."""
        request = urllib.request.Request(  # noqa: S310 (https only, checked above)
            self.server + path,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"},
        )
        try:
            opened = urllib.request.urlopen(request, context=self.context, timeout=30)  # noqa: S310
            with opened as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return 404, None
            detail = err.read().decode("utf-8", "replace")
            with contextlib.suppress(ValueError):
                detail = json.loads(detail).get("message", detail)
            raise Refusal(f"{method} {path}: HTTP {err.code}: {detail}") from err


def _clients(api: Api) -> list[str]:
    status, body = api.call("GET", f"/apis/{GROUP_VERSION}/clients")
    if status == 404:  # the CRD is gone: no Client can exist
        return []
    return [f"{item['metadata']['namespace']}/{item['metadata']['name']}" for item in body["items"]]


def _release_thunderclusters(api: Api, release: str, namespace: str) -> list[str]:
    status, body = api.call("GET", f"/apis/{GROUP_VERSION}/thunderclusters")
    if status == 404:
        return []
    names = []
    for item in body["items"]:
        annotations = item["metadata"].get("annotations") or {}
        if (
            annotations.get(RELEASE_ANNOTATION) == release
            and annotations.get(NAMESPACE_ANNOTATION) == namespace
        ):
            names.append(item["metadata"]["name"])
    return sorted(names)


def _get(api: Api, name: str) -> dict[str, Any] | None:
    status, body = api.call("GET", f"/apis/{GROUP_VERSION}/thunderclusters/{name}")
    return None if status == 404 else dict(body)


def _held_message(
    held: dict[str, list[str]], release: str, namespace: str, operator: str, timeout: float
) -> str:
    lines = [
        f"refusing to go on: after {timeout:.0f}s the operator has not released "
        + ", ".join(f"thundercluster/{name}" for name in held)
        + ".",
    ]
    for name, finalizers in held.items():
        lines.append(f"  thundercluster/{name}: finalizers {', '.join(finalizers) or '(none)'}")
    if any(OPERATOR_FINALIZER in finalizers for finalizers in held.values()):
        lines += [
            f"The finalizer {OPERATOR_FINALIZER} is released by the running operator. Check "
            "that it runs and reconciles:",
            f"  kubectl -n {namespace} get deployment {operator}",
            f"  kubectl -n {namespace} logs deployment/{operator}",
            "then run helm uninstall again. If the operator cannot run any more, `make "
            "uninstall` removes the release and then that one finalizer, or by hand:",
            f"  helm uninstall {release} -n {namespace} --no-hooks",
            "  kubectl patch thundercluster <name> --type=json "
            """-p='[{"op":"remove","path":"/metadata/finalizers"}]'""",
            "That finalizer holds nothing outside the cluster: what the ThunderCluster owns "
            "(the daemon DaemonSet, ResourceSlices, DeviceClasses) is garbage-collected with "
            "it.",
        ]
    else:
        lines.append(
            "Other finalizers hold it: whoever added them must release them, then run "
            "helm uninstall again."
        )
    return "\n".join(lines)


def run(out: Any) -> int:
    release = os.environ["TDP_RELEASE"]
    namespace = os.environ["TDP_NAMESPACE"]
    operator = os.environ.get("TDP_OPERATOR", "<operator deployment>")
    timeout = float(os.environ.get("TDP_TIMEOUT_SECONDS", "120"))
    api = Api()

    clients = _clients(api)
    if clients:
        shown = ", ".join(clients[:10]) + (
            f" and {len(clients) - 10} more" if len(clients) > 10 else ""
        )
        raise Refusal(
            f"refusing to uninstall release {release}: {len(clients)} "
            f"clients.thundercompute.com still exist ({shown}). Each holds a Thunder "
            "enrollment that only the running operator revokes; removing the driver now "
            "would strand them. Delete the pods and ResourceClaims that use Thunder GPUs, "
            "wait until `kubectl get clients.thundercompute.com -A` lists none, then run "
            "helm uninstall again. (helm uninstall --no-hooks skips this check and leaves "
            "those enrollments for you to revoke in Thunder.)"
        )

    names = _release_thunderclusters(api, release, namespace)
    if not names:
        out.write(f"no ThunderCluster of release {namespace}/{release}: nothing to release\n")
        return 0
    for name in names:
        status, _ = api.call("DELETE", f"/apis/{GROUP_VERSION}/thunderclusters/{name}")
        if status != 404:
            out.write(f"deleted thundercluster/{name}\n")
    out.write(
        f"waiting up to {timeout:.0f}s for the operator to release "
        + ", ".join(f"thundercluster/{n}" for n in names)
        + f" (finalizer {OPERATOR_FINALIZER})\n"
    )
    out.flush()
    deadline = time.monotonic() + timeout
    held = list(names)
    while True:
        current = {n: _get(api, n) for n in held}
        held = [n for n, obj in current.items() if obj is not None]
        if not held:
            out.write("the operator released the ThunderCluster; the release can go\n")
            return 0
        if time.monotonic() >= deadline:
            finalizers = {
                n: list((current[n] or {}).get("metadata", {}).get("finalizers") or [])
                for n in held
            }
            raise Refusal(_held_message(finalizers, release, namespace, operator, timeout))
        time.sleep(POLL_SECONDS)


def main() -> int:
    try:
        return run(sys.stdout)
    except Refusal as refusal:
        sys.stdout.flush()
        print(str(refusal), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
