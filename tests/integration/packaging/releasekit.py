"""Installing the chart on the local control plane and taking it away again, as the
packaging tests do: `helm` with the test's environment, and the teardown of a release on
a control plane with no kubelet (no pod ever ends by itself, no hook Job ever runs).
"""

from __future__ import annotations

import contextlib
import subprocess

from kubernetes import client as k8s

from hack.testbed.kube import Kube, wait_for
from hack.testbed.operator import THUNDER_API
from thunder_dra.controllers.workload.daemonset import CONSUMER_DAEMONSET_NAME, DAEMONSET_NAME


def helm(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["helm", *args], env=env, check=check, capture_output=True, text=True, timeout=300
    )


def release_thundercluster(kube: Kube, name: str, timeout: float = 45) -> None:
    """Delete the ThunderCluster and give the running operator `timeout` seconds to
    release its finalizer (it may not: the caller clears what is left)."""
    if kube.get(THUNDER_API, "ThunderCluster", name) is None:
        return
    kube.delete(THUNDER_API, "ThunderCluster", name)
    with contextlib.suppress(AssertionError):
        wait_for(
            lambda: kube.get(THUNDER_API, "ThunderCluster", name) is None,
            "the operator to release the ThunderCluster",
            timeout=timeout,
        )


def clear_finalizers(kube: Kube, name: str) -> None:
    """Remove the ThunderCluster's finalizers, for when no operator runs to do it."""
    if kube.get(THUNDER_API, "ThunderCluster", name) is not None:
        kube.resource(THUNDER_API, "ThunderCluster").patch(
            name=name,
            body={"metadata": {"finalizers": None}},
            content_type="application/merge-patch+json",
        )


def uninstall(env: dict[str, str], kube: Kube, release: str, namespace: str, tc_name: str) -> None:
    """`helm uninstall --no-hooks` (no kubelet runs the chart's pre-delete Job here; it is
    tested in test_packaging_uninstall_hook by running its script), then what no kubelet
    or operator finishes: the ThunderCluster's finalizers, both daemon DaemonSets and
    every pod left, at once."""
    helm(env, "uninstall", release, "--namespace", namespace, "--no-hooks", check=False)
    clear_finalizers(kube, tc_name)
    for daemon_set in (DAEMONSET_NAME, CONSUMER_DAEMONSET_NAME):
        kube.delete("apps/v1", "DaemonSet", daemon_set, namespace)
    for pod in kube.core.list_namespaced_pod(namespace).items:
        if pod.metadata is not None and pod.metadata.name:
            with contextlib.suppress(k8s.ApiException):
                kube.core.delete_namespaced_pod(
                    pod.metadata.name, namespace, grace_period_seconds=0
                )
