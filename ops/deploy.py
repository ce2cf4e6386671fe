# Operates a thunder-device-plugin deployment on the cluster of the current kubeconfig:
# the seed's make install / uninstall / status / logs / purge.
#
#   .venv/bin/python -m ops.deploy install   # needs THUNDER_API_TOKEN: namespace, Secret, helm
#   .venv/bin/python -m ops.deploy uninstall # helm uninstall, after typing the context back
#   .venv/bin/python -m ops.deploy status    # release, operator, daemon, ThunderCluster, inventory
#   .venv/bin/python -m ops.deploy logs      # operator and daemon logs (COMPONENT=, FOLLOW=1)
#   .venv/bin/python -m ops.deploy purge     # the release and everything the driver wrote
#
# Settings (environment, as the make targets pass them): RELEASE (thunder-device-plugin),
# NAMESPACE (thunder-system), CHART (charts/thunder-device-plugin), HELM_ARGS (extra
# helm upgrade arguments), SECRET_NAME (thunder-api), KUBE_CONTEXT (default: current),
# KUBECONFIG, KUBECTL and HELM (binaries; default: PATH, then hack/build-tools.sh's).
# uninstall and purge refuse while clients.thundercompute.com exist unless FORCE=1,
# and ask for the context name to be typed back unless YES=1. Both delete the
# ThunderCluster first, while the operator still runs to release its finalizer
# (thundercompute.com/operator); OPERATOR_WAIT (seconds, default 60) is how long they
# wait for that before saying so and removing the finalizer themselves.
"""Install, inspect and remove thunder-device-plugin."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO

from kubernetes import client, config, dynamic
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError

REPO: Final = Path(__file__).resolve().parents[1]
APP_SELECTOR: Final = "app.kubernetes.io/name=thunder-dra-driver"
GROUP: Final = "thundercompute.com"
OUR_CRDS: Final = (f"thunderclusters.{GROUP}", f"clients.{GROUP}")
PEERING_CRD: Final = "clusterkopfpeerings.kopf.dev"
"""kopf's peering CRD, installed by releases before leader election moved to a Lease."""
TC_API: Final = f"{GROUP}/v1alpha1"
OPERATOR_FINALIZER: Final = f"{GROUP}/operator"
HELM_RELEASE_ANNOTATION: Final = "meta.helm.sh/release-name"
HELM_NAMESPACE_ANNOTATION: Final = "meta.helm.sh/release-namespace"


class Refused(Exception):
    """The operation was refused before anything was changed."""


@dataclass(frozen=True, slots=True)
class Settings:
    release: str
    namespace: str
    chart: Path
    secret_name: str
    helm_args: tuple[str, ...]
    context: str | None
    force: bool
    yes: bool
    operator_wait: float = 60.0

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        e = dict(os.environ if env is None else env)

        def flag(name: str) -> bool:
            return e.get(name, "").strip().lower() in ("1", "true", "yes", "y")

        return cls(
            release=e.get("RELEASE") or "thunder-device-plugin",
            namespace=e.get("NAMESPACE") or "thunder-system",
            chart=Path(e.get("CHART") or REPO / "charts" / "thunder-device-plugin"),
            secret_name=e.get("SECRET_NAME") or "thunder-api",
            helm_args=tuple(shlex.split(e.get("HELM_ARGS", ""))),
            context=e.get("KUBE_CONTEXT") or None,
            force=flag("FORCE"),
            yes=flag("YES"),
            operator_wait=float(e.get("OPERATOR_WAIT") or 60),
        )


def tool(name: str) -> str:
    """kubectl or helm: $KUBECTL/$HELM, else PATH, else the project's built tools."""
    explicit = os.environ.get(name.upper())
    if explicit:
        return explicit
    found = shutil.which(name)
    if found:
        return found
    built = subprocess.run(
        [str(REPO / "hack" / "build-tools.sh")], check=True, capture_output=True, text=True
    ).stdout.strip()
    return str(Path(built) / name)


class Cluster:
    """The cluster of the kubeconfig: typed and dynamic clients, and the CLI tools."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        _, active = config.list_kube_config_contexts()  # type: ignore[no-untyped-call]
        self.context: str = settings.context or (active or {}).get("name", "")
        self.api = config.new_client_from_config(context=self.context or None)  # type: ignore[no-untyped-call]
        self.core = client.CoreV1Api(self.api)
        self.dyn = dynamic.DynamicClient(self.api)  # type: ignore[no-untyped-call]

    def cli_args(self) -> list[str]:
        return ["--kube-context", self.context] if self.context else []

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        ctx = ["--context", self.context] if self.context else []
        return subprocess.run([tool("kubectl"), *ctx, *args], check=check, text=True)

    def helm(
        self, *args: str, check: bool = True, quiet: bool = False
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [tool("helm"), *self.cli_args(), *args], check=check, text=True, capture_output=quiet
        )

    def resource(self, api_version: str, kind: str) -> Any | None:
        try:
            return self.dyn.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            return None

    def list_names(
        self, api_version: str, kind: str, selector: str | None = None
    ) -> list[tuple[str | None, str]]:
        res = self.resource(api_version, kind)
        if res is None:
            return []
        items = res.get(label_selector=selector).to_dict()["items"]
        return [(i["metadata"].get("namespace"), i["metadata"]["name"]) for i in items]

    def clients(self) -> list[tuple[str | None, str]]:
        return self.list_names(f"{GROUP}/v1alpha1", "Client")


# -- confirmation ------------------------------------------------------------------


def confirm(
    action: str,
    context: str,
    stdin: TextIO,
    stdout: TextIO,
) -> bool:
    """Name the cluster and wait for its context to be typed back."""
    stdout.write(
        f"\nThis will {action}\non cluster context: {context}\n"
        f"Type the context name to continue, anything else to stop: "
    )
    stdout.flush()
    answer = stdin.readline()
    return answer.strip() == context


def guard(cluster: Cluster, action: str, stdin: TextIO, stdout: TextIO) -> None:
    """Refuse while Clients exist (unless FORCE) and ask for the context (unless YES)."""
    settings = cluster.settings
    live = cluster.clients()
    if live and not settings.force:
        shown = ", ".join(f"{ns}/{name}" for ns, name in live[:10])
        more = f" and {len(live) - 10} more" if len(live) > 10 else ""
        raise Refused(
            f"refusing to {action.split(' ', 1)[0]}: {len(live)} clients.thundercompute.com "
            f"still exist ({shown}{more}). Removing the driver now would strand their Thunder "
            "enrollments with nothing left to revoke them. Delete the workloads using Thunder "
            "GPUs first, or set FORCE=1 to go ahead anyway."
        )
    if live:
        stdout.write(f"FORCE=1: going ahead although {len(live)} Client(s) exist.\n")
    if settings.yes:
        stdout.write(f"YES=1: not asking; context {cluster.context}.\n")
        return
    if not stdin.isatty():
        raise Refused(
            "no terminal to confirm on: run it interactively, or set YES=1 to skip the prompt"
        )
    if not confirm(action, cluster.context, stdin, stdout):
        raise Refused("stopped: the context name was not typed back; nothing was changed")


# -- commands -----------------------------------------------------------------------


def cmd_install(cluster: Cluster, out: TextIO) -> int:
    s = cluster.settings
    token = os.environ.get("THUNDER_API_TOKEN", "")
    if not token.strip():
        raise Refused(
            "THUNDER_API_TOKEN is not set: export it (it is written into the Secret "
            f"{s.namespace}/{s.secret_name}, never shown or passed to helm)"
        )
    try:
        cluster.core.read_namespace(s.namespace)
    except ApiException as err:
        if err.status != 404:
            raise
        cluster.core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=s.namespace))
        )
        out.write(f"namespace/{s.namespace} created\n")
    secret = client.V1Secret(
        metadata=client.V1ObjectMeta(name=s.secret_name, namespace=s.namespace),
        type="Opaque",
        string_data={"THUNDER_API_TOKEN": token.strip()},
    )
    try:
        cluster.core.replace_namespaced_secret(s.secret_name, s.namespace, secret)
        out.write(f"secret/{s.secret_name} updated (THUNDER_API_TOKEN from the environment)\n")
    except ApiException as err:
        if err.status != 404:
            raise
        cluster.core.create_namespaced_secret(s.namespace, secret)
        out.write(f"secret/{s.secret_name} created (THUNDER_API_TOKEN from the environment)\n")
    out.flush()
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(s.chart / "crds"))
    cluster.helm(
        "upgrade",
        "--install",
        s.release,
        str(s.chart),
        "--namespace",
        s.namespace,
        "--set",
        f"thunder.secretName={s.secret_name}",
        *s.helm_args,
    )
    return 0


def _thunderclusters(cluster: Cluster, release_only: bool) -> list[str]:
    """ThunderCluster names: the release's own, or every one (purge)."""
    res = cluster.resource(TC_API, "ThunderCluster")
    if res is None:
        return []
    s = cluster.settings
    names = []
    for item in res.get().to_dict()["items"]:
        annotations = item["metadata"].get("annotations") or {}
        if release_only and (
            annotations.get(HELM_RELEASE_ANNOTATION) != s.release
            or annotations.get(HELM_NAMESPACE_ANNOTATION) != s.namespace
        ):
            continue
        names.append(item["metadata"]["name"])
    return names


def _get_thundercluster(cluster: Cluster, name: str) -> dict[str, Any] | None:
    res = cluster.resource(TC_API, "ThunderCluster")
    if res is None:
        return None
    try:
        found: dict[str, Any] = res.get(name=name).to_dict()
    except NotFoundError:
        return None
    return found


def delete_thunderclusters(cluster: Cluster, names: Sequence[str], out: TextIO) -> list[str]:
    """Delete the ThunderClusters while the operator runs; return those it did not release.

    The operator keeps its kopf finalizer on a ThunderCluster it reconciles and removes it
    once its loops for that object have stopped. Deleting the ThunderCluster before the
    release (which stops the operator) lets it do so; helm uninstall alone would delete
    the operator first and leave the ThunderCluster Terminating.
    """
    res = cluster.resource(TC_API, "ThunderCluster")
    if res is None or not names:
        return []
    for name in names:
        try:
            res.delete(name=name)
            out.write(f"deleted thundercluster/{name}\n")
        except NotFoundError:
            pass
    wait = cluster.settings.operator_wait
    held = [n for n in names if _get_thundercluster(cluster, n) is not None]
    if held:
        out.write(
            f"waiting up to {wait:.0f}s for the operator to release "
            f"{', '.join(f'thundercluster/{n}' for n in held)} "
            f"(finalizer {OPERATOR_FINALIZER})\n"
        )
        out.flush()
    deadline = time.monotonic() + wait
    while held and time.monotonic() < deadline:
        time.sleep(0.5)
        held = [n for n in held if _get_thundercluster(cluster, n) is not None]
    if names and not held:
        out.write("the operator released the ThunderCluster\n")
    return held


def release_operator_finalizer(cluster: Cluster, names: Sequence[str], out: TextIO) -> None:
    """Remove the operator's finalizer from ThunderClusters no running operator released.

    Only `thundercompute.com/operator`: it holds nothing outside the cluster (it only
    lets the operator stop its loops first), and the objects the ThunderCluster owns
    (the daemon DaemonSet, ResourceSlices, DeviceClasses) are garbage-collected with it.
    Other finalizers are left alone. Called after the release is gone, so the webhook
    the operator no longer serves cannot refuse the update.
    """
    res = cluster.resource(TC_API, "ThunderCluster")
    if res is None:
        return
    released = []
    for name in names:
        current = _get_thundercluster(cluster, name)
        if current is None:
            continue
        others = current["metadata"].get("finalizers") or []
        if OPERATOR_FINALIZER not in others:
            out.write(
                f"thundercluster/{name} is held by finalizers {', '.join(others)}, not the "
                "operator's: leaving it Terminating for whoever owns them.\n"
            )
            continue
        if others == [OPERATOR_FINALIZER]:
            released.append(name)  # nothing else holds it: wait until it is gone
        out.write(
            f"thundercluster/{name} is still held by the finalizer {OPERATOR_FINALIZER} "
            f"after {cluster.settings.operator_wait:.0f}s: the operator is not running. "
            "Removing that finalizer; what the ThunderCluster owns is garbage-collected "
            "with it.\n"
        )
        out.flush()
        deadline = time.monotonic() + 30.0
        while True:
            current = _get_thundercluster(cluster, name)
            if current is None:
                break
            meta = current["metadata"]
            finalizers = [f for f in meta.get("finalizers") or [] if f != OPERATOR_FINALIZER]
            try:
                res.patch(
                    name=name,
                    body={
                        "metadata": {
                            "finalizers": finalizers or None,
                            "resourceVersion": meta["resourceVersion"],
                        }
                    },
                    content_type="application/merge-patch+json",
                )
                break
            except NotFoundError:
                break
            except ApiException as err:
                # 409: changed meanwhile; 500: a webhook configuration being removed with
                # the release is still cached by the API server for a moment.
                if err.status not in (409, 500) or time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
        out.write(f"removed finalizer {OPERATOR_FINALIZER} from thundercluster/{name}\n")
    _wait_gone(
        lambda: any(_get_thundercluster(cluster, n) is not None for n in released),
        "the ThunderCluster",
    )


def cmd_uninstall(cluster: Cluster, stdin: TextIO, out: TextIO) -> int:
    s = cluster.settings
    guard(cluster, f"uninstall release {s.release} from namespace {s.namespace}", stdin, out)
    held = delete_thunderclusters(cluster, _thunderclusters(cluster, release_only=True), out)
    # helm's --wait would wait for a ThunderCluster nothing releases any more.
    wait = [] if held else ["--wait"]
    # --no-hooks: the chart's pre-delete hook makes the checks just made (without FORCE,
    # and without the finalizer release below when the operator is gone).
    cluster.helm("uninstall", s.release, "--namespace", s.namespace, "--no-hooks", *wait)
    release_operator_finalizer(cluster, held, out)
    out.write(
        "The CRDs and the namespace remain (and Client records, if any); "
        "`make purge` removes them.\n"
    )
    return 0


def _earlier_peering_names(s: Settings) -> list[str]:
    """The ClusterKopfPeering objects releases before the Lease made: the chart named its
    object after the release's full name; an operator run without the chart used its
    default name."""
    chart = "thunder-device-plugin"
    fullname = s.release if chart in s.release else f"{s.release}-{chart}"
    return sorted({fullname[:63].rstrip("-"), "thunder-dra-operator"})


def _delete_named(
    cluster: Cluster, api_version: str, kind: str, names: Sequence[str], out: TextIO
) -> None:
    res = cluster.resource(api_version, kind)
    if res is None:
        return
    for name in names:
        try:
            res.delete(name=name)
        except NotFoundError:
            continue
        out.write(f"deleted {kind.lower()}/{name}\n")


def _delete_all(
    cluster: Cluster,
    api_version: str,
    kind: str,
    selector: str | None,
    out: TextIO,
    strip_finalizers: bool = False,
) -> None:
    res = cluster.resource(api_version, kind)
    if res is None:
        return
    for ns, name in cluster.list_names(api_version, kind, selector):
        where = f" -n {ns}" if ns else ""
        if strip_finalizers:
            try:
                res.patch(
                    name=name,
                    namespace=ns,
                    body={"metadata": {"finalizers": None}},
                    content_type="application/merge-patch+json",
                )
            except NotFoundError:
                continue
        try:
            res.delete(name=name, namespace=ns)
            out.write(f"deleted {kind.lower()}/{name}{where}\n")
        except NotFoundError:
            pass


def _wait_gone(check: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while check():
        if time.monotonic() > deadline:
            raise Refused(f"timed out waiting for {what} to go away")
        time.sleep(0.5)


def cmd_purge(cluster: Cluster, stdin: TextIO, out: TextIO) -> int:
    s = cluster.settings
    guard(
        cluster,
        f"remove release {s.release}, namespace {s.namespace}, every ThunderCluster, "
        "Client, driver ResourceSlice and DeviceClass, and the thundercompute.com CRDs",
        stdin,
        out,
    )
    # The ThunderClusters first, while the operator can still release its finalizer;
    # then the release: that stops the operator and removes the webhook, so nothing
    # re-creates or validates what is deleted next.
    held = delete_thunderclusters(cluster, _thunderclusters(cluster, release_only=False), out)
    listed = cluster.helm("status", s.release, "--namespace", s.namespace, check=False, quiet=True)
    if listed.returncode == 0:
        wait = [] if held else ["--wait"]
        cluster.helm("uninstall", s.release, "--namespace", s.namespace, "--no-hooks", *wait)
    admission = "admissionregistration.k8s.io/v1"
    _delete_all(cluster, admission, "ValidatingWebhookConfiguration", APP_SELECTOR, out)
    release_operator_finalizer(cluster, held, out)
    # With the operator gone nothing will revoke these enrollments: only FORCE=1 (which
    # the guard demanded if any existed) drops the finalizers that wait for it.
    _delete_all(cluster, TC_API, "Client", None, out, strip_finalizers=s.force)
    _delete_all(cluster, "resource.k8s.io/v1", "ResourceSlice", APP_SELECTOR, out)
    _delete_all(cluster, "resource.k8s.io/v1", "DeviceClass", APP_SELECTOR, out)
    # Left by a release from before leader election moved to a Lease (the Lease goes
    # with the namespace). Only this release's own peering objects: other kopf operators
    # may use kopf's peering too.
    _delete_named(cluster, "kopf.dev/v1", "ClusterKopfPeering", _earlier_peering_names(s), out)
    # Runtime Secrets the daemon labelled (KubeVirt setup Secrets are also owned by
    # their claims and go with them).
    _delete_all(cluster, "v1", "Secret", APP_SELECTOR, out)
    crd_api = "apiextensions.k8s.io/v1"
    crds = list(OUR_CRDS)
    # kopf's peering CRD may serve other kopf operators: only remove it when unused.
    if not cluster.list_names("kopf.dev/v1", "ClusterKopfPeering"):
        crds.append(PEERING_CRD)
    crd_res = cluster.dyn.resources.get(api_version=crd_api, kind="CustomResourceDefinition")
    for name in crds:
        try:
            crd_res.delete(name=name)
            out.write(f"deleted customresourcedefinition/{name}\n")
        except NotFoundError:
            pass
    try:
        cluster.core.delete_namespace(s.namespace)
        out.write(f"deleted namespace/{s.namespace}\n")
    except ApiException as err:
        if err.status != 404:
            raise

    def namespace_exists() -> bool:
        try:
            cluster.core.read_namespace(s.namespace)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    _wait_gone(namespace_exists, f"namespace {s.namespace}")
    out.write("purged\n")
    return 0


def _conditions(obj: dict[str, Any]) -> str:
    conds = obj.get("status", {}).get("conditions", [])
    return ", ".join(f"{c['type']}={c['status']}" for c in conds) or "no conditions yet"


def cmd_status(cluster: Cluster, out: TextIO) -> int:
    s = cluster.settings
    out.write(f"context {cluster.context}, namespace {s.namespace}\n\n")
    out.flush()
    cluster.helm("status", s.release, "--namespace", s.namespace, "--show-resources", check=False)
    out.write("\n")
    out.flush()
    cluster.kubectl(
        "get", "deployments,daemonsets,pods", "-n", s.namespace, "-l", APP_SELECTOR, check=False
    )
    tc = cluster.resource(f"{GROUP}/v1alpha1", "ThunderCluster")
    if tc is not None:
        for item in tc.get().to_dict()["items"]:
            out.write(f"\nthundercluster/{item['metadata']['name']}: {_conditions(item)}\n")
    out.write("\n")
    out.flush()
    cluster.kubectl(
        "get",
        "deviceclasses",
        "-l",
        APP_SELECTOR,
        "-o",
        "custom-columns=CLASS:.metadata.name,RESOURCE:.spec.extendedResourceName",
        check=False,
    )
    slices = len(cluster.list_names("resource.k8s.io/v1", "ResourceSlice", APP_SELECTOR))
    clients = len(cluster.clients())
    out.write(f"\n{slices} ResourceSlice(s), {clients} Client(s)\n")
    return 0


def cmd_logs(cluster: Cluster, out: TextIO) -> int:
    s = cluster.settings
    wanted = os.environ.get("COMPONENT", "").strip()
    follow = os.environ.get("FOLLOW", "").strip() in ("1", "true", "yes")
    components = [wanted] if wanted else ["operator", "daemon"]
    for component in components:
        out.write(f"==> {component} ({s.namespace}, app.kubernetes.io/component={component})\n")
        out.flush()
        args = [
            "logs",
            "-n",
            s.namespace,
            "-l",
            f"{APP_SELECTOR},app.kubernetes.io/component={component}",
            "--all-containers",
            "--prefix",
            "--tail",
            os.environ.get("TAIL", "200"),
        ]
        if follow and len(components) == 1:
            args.append("--follow")
        cluster.kubectl(*args, check=False)
    return 0


def main(
    argv: Sequence[str] | None = None,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=["install", "uninstall", "status", "logs", "purge"])
    args = parser.parse_args(argv)
    stdin = stdin or sys.stdin
    out = stdout or sys.stdout
    try:
        cluster = Cluster(Settings.from_env())
        if args.command == "install":
            return cmd_install(cluster, out)
        if args.command == "uninstall":
            return cmd_uninstall(cluster, stdin, out)
        if args.command == "purge":
            return cmd_purge(cluster, stdin, out)
        if args.command == "status":
            return cmd_status(cluster, out)
        return cmd_logs(cluster, out)
    except Refused as err:
        print(f"\n{err}", file=sys.stderr)
        return 3
    except subprocess.CalledProcessError as err:
        print(f"\n{Path(err.cmd[0]).name} failed with exit code {err.returncode}", file=sys.stderr)
        return 1
    except (config.ConfigException, OSError) as err:
        print(f"cannot reach a cluster: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
