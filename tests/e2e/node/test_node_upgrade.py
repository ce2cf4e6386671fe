"""Upgrade from the last release with Helm, on a real node, while a claim is held.

The last release is the commit ``release/last-release`` pins (``hack.node.last_release``):
its tree from git and its operator and daemon images, built by its own image builder and
imported into the node. It is installed by that tree's README's Install commands, with its
chart and its CRDs, and the fake Thunder as the API (``hack.node.chart.installed``). A pod
holding a ResourceClaim for two GPUs runs, reading its injected files every second.

Then the upgrade as the current README says: the CRDs re-applied with its Install
section's command (Helm never upgrades ``crds/``) and ``helm upgrade`` of the release to
the tree's chart, with the tree's images. The module runs twice: with the node serving,
and with its serving label removed just before the upgrade, so that the tree's consumer
DaemonSet takes the node over from the last release's one DaemonSet (the label is back
when the module ends, for the folder's later modules).

Then, in order: the node had a Ready daemon pod at every sample through the upgrade; the
operator and the daemon run the tree's images, and the DaemonSets are exactly what the
tree's operator renders (one daemon pod on the node, of its role; none of the last
release's DaemonSet left; the old DaemonSet updated only after the consumer one was
created and ready, by the operator's events); the held pod kept running and reading its
files, and a process started in it after the upgrade still gets them; a new claim's pod
runs with its files; no prepare failed (neither a ``FailedPrepareDynamicResources`` event
nor the kubelet's log line); and once the pods and claims are deleted nothing is left and
no enrollment leaked.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from hack import image as image_builder
from hack.node.chart import (
    CHART,
    DAEMON_SET,
    INJECTED,
    NAMESPACE,
    REPO,
    Install,
    check_injected,
    installed,
    merged,
    readme_install,
    running,
    wait,
)
from hack.node.chart import _image_values as image_values
from hack.node.last_release import LastRelease, last_release
from hack.node.launcher import Node
from tests.e2e.node.conftest import pod_logs, run_pod, stock_pod
from thunder_dra.api.thundercluster import ThunderClusterSpec
from thunder_dra.controllers.shared.ownership import ThunderClusterRef
from thunder_dra.controllers.workload import daemonset
from thunder_dra.controllers.workload.tracing import DaemonTracing
from thunder_dra.kube import naming

CLASS = "thunder-gpu-a6000"
HELD = "held-across-upgrade"
TEMPLATE = "upgrade-two-a6000"
AFTER = "after-upgrade"
CONSUMER_DS = daemonset.CONSUMER_DAEMONSET_NAME
SERVING_LABEL = naming.NODE_LABEL_SERVING
ROLES = ("serving", "consumer")
# The held pod reads its injected files every second and says so, with the time.
HELD_SCRIPT = r"""
while true; do
  if [ -r /etc/thunder/libthunder.so ] && python3 -c 'import json
json.load(open("/etc/thunder/config.json"))' 2>/dev/null; then
    echo "read $(date +%s) ok"
  else
    echo "read $(date +%s) FAILED"
  fi
  sleep 1
done
"""


@dataclass
class Upgrade:
    install: Install
    last: LastRelease
    current: dict[str, image_builder.BuiltImage]
    kubelet_log_start: int
    # The node's role through the upgrade: "serving", or "consumer" (its serving label
    # removed before the upgrade, so the tree's consumer DaemonSet takes it over).
    role: str
    held_container: str = ""
    upgraded_at: float = 0.0
    upgrade_output: str = ""
    # The Ready daemon pods on the node, sampled every second from the upgrade on.
    ready_daemons: list[int] = field(default_factory=list)
    sampling: threading.Event = field(default_factory=threading.Event)


@pytest.fixture(scope="module")
def last(real_node: Node) -> LastRelease:
    release = last_release()
    for image in release.images.values():
        real_node.import_image(image.archive)
    return release


@pytest.fixture(scope="module", params=ROLES)
def upgrade(
    request: pytest.FixtureRequest,
    real_node: Node,
    node_images: dict[str, image_builder.BuiltImage],
    last: LastRelease,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Upgrade]:
    role = str(request.param)
    workdir = tmp_path_factory.mktemp(f"node-upgrade-{role}")
    old_images = {**node_images, **last.images}
    kubelet_log_start = len(real_node.logs("kubelet").splitlines())
    with installed(real_node, old_images, workdir, tree=last.tree) as done:
        upgrade = Upgrade(done, last, node_images, kubelet_log_start, role)
        try:
            yield upgrade
        finally:
            upgrade.sampling.set()
            done.node.kubectl("delete", "pods", "--all", "-n", "default", "--wait=true",
                              check=False, timeout=180)  # fmt: skip
            done.node.kubectl("delete", "resourceclaimtemplates", "--all", "-n", "default",
                              check=False)  # fmt: skip
            # Serving again, as the folder's other modules expect the node.
            done.node.kubectl("label", "node", done.node.config.name, f"{SERVING_LABEL}=true",
                              "--overwrite")  # fmt: skip


def _daemon_image(pod: dict[str, Any]) -> str:
    return str(pod["spec"]["containers"][0]["image"])


def _ready(pod: dict[str, Any]) -> bool:
    conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    return conditions.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp")


def test_the_last_release_runs_with_its_own_images(upgrade: Upgrade) -> None:
    install, last = upgrade.install, upgrade.last
    assert "STATUS: deployed" in install.install_output, install.install_output
    assert last.chart == last.tree / "charts" / "thunder-device-plugin"
    assert (last.crds / "thunderclusters.thundercompute.com.yaml").is_file()
    deployment = _operator_deployment(install)
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == last.images["operator"].ref
    pod = wait(install.ready_daemon_pod, "the last release's daemon pod Ready", timeout=240)
    assert _daemon_image(pod) == last.images["daemon"].ref
    # The last release renders one DaemonSet, on every node, with no node role.
    assert install.get("daemonset", "-n", NAMESPACE, CONSUMER_DS) is None
    stored = install.get("daemonset", "-n", NAMESPACE, DAEMON_SET)
    assert daemonset.predates_roles(stored), stored["spec"]["template"]["metadata"]
    enrolled = wait(install.enrolled_host, "the serving node registered with Thunder", 240)
    assert (enrolled["gpuType"], enrolled["gpuCount"]) == ("A6000", 4)


def test_a_pod_of_the_last_release_holds_a_claim(upgrade: Upgrade) -> None:
    install = upgrade.install
    zone = wait(install.zone_id, "the node's zone in Thunder")
    install.fake.admin.set_targets(zone, {"A6000": 1.5})
    wait(lambda: install.get("deviceclass", CLASS), f"DeviceClass {CLASS}", timeout=240)
    request = {
        "name": "gpu",
        "exactly": {"deviceClassName": CLASS, "allocationMode": "ExactCount", "count": 2},
    }
    install.apply(
        "upgrade-claim-template",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": TEMPLATE, "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [request]}}},
        },
    )
    install.apply("held-pod", _claim_pod(install, HELD, HELD_SCRIPT))
    pod = wait(lambda: running(install, HELD), f"pod {HELD} running", timeout=240)
    upgrade.held_container = pod["status"]["containerStatuses"][0]["containerID"]
    wait(lambda: " ok" in pod_logs(install.node, HELD), f"{HELD} reading its files")
    check_injected(install, _exec_injected(install, HELD))
    assert len(install.clients("default")) == 1


def test_helm_upgrade_to_the_tree_with_the_crds_reapplied(upgrade: Upgrade) -> None:
    install = upgrade.install
    values = merged(
        install.values,
        {
            "operator": {"image": image_values(upgrade.current["operator"])},
            "daemon": {"image": image_values(upgrade.current["daemon"])},
        },
    )
    path = install.workdir / "values-upgrade.yaml"
    path.write_text(yaml.safe_dump(values))
    if upgrade.role == "consumer":
        # The node stops serving; the last release's daemon, one DaemonSet on every node,
        # keeps running on it until the tree's consumer DaemonSet is ready.
        install.node.kubectl("label", "node", install.node.config.name, f"{SERVING_LABEL}-")
    threading.Thread(target=_sample_ready_daemons, args=(upgrade,), daemon=True).start()
    upgrade.upgraded_at = time.time()
    upgrade.upgrade_output = readme_upgrade(install, path)
    install.values = values
    install.images = upgrade.current
    assert "STATUS: deployed" in upgrade.upgrade_output, upgrade.upgrade_output
    assert "REVISION: 2" in upgrade.upgrade_output, upgrade.upgrade_output
    # The CRDs are the tree's: a field the last release's CRD did not have is served.
    crd = install.get("crd", "thunderclusters.thundercompute.com")
    served = json.dumps(crd["spec"]["versions"])
    assert "noExecuteAfter" in served


def _sample_ready_daemons(upgrade: Upgrade) -> None:
    while not upgrade.sampling.is_set():
        pods = upgrade.install.daemon_pods()
        upgrade.ready_daemons.append(sum(1 for p in pods if _ready(p)))
        upgrade.sampling.wait(1)


def readme_upgrade(install: Install, values: Path) -> str:
    """The current README's upgrade: its Install section's CRD command, re-applied (Helm
    never upgrades ``crds/``), then ``helm upgrade`` in place of its ``helm install``, with
    the test's values; the output of ``helm upgrade``."""
    output = ""
    for argv in readme_install():
        tool = argv[0]
        args = [str(REPO / a) if not a.startswith("-") and (REPO / a).exists() else a
                for a in argv[1:]]  # fmt: skip
        if tool == "kubectl" and args[:2] == ["apply", "--server-side"]:
            assert args[-1] == str(CHART / "crds"), args
            install.node.kubectl(*args)
        elif tool == "helm":
            assert args[0] == "install", args
            assert args[2] == str(CHART), args
            output = install.helm(
                "upgrade", *args[1:], "-f", str(values), "--wait", "--timeout", "5m"
            )
    assert output, "README.md's Install section has no helm install"
    return output


def _rendered(install: Install) -> dict[str, dict[str, Any]]:
    """The DaemonSets the tree's operator renders for the stored ThunderCluster, by name."""
    cluster = _thundercluster(install)
    operator = _operator_deployment(install)
    container = operator["spec"]["template"]["spec"]["containers"][0]
    environ = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    bodies = daemonset.render_all(
        ThunderClusterSpec.model_validate(cluster["spec"]),
        NAMESPACE,
        ThunderClusterRef(cluster["metadata"]["name"], cluster["metadata"]["uid"]),
        environ["THUNDER_DAEMON_SERVICE_ACCOUNT"],
        tracing=DaemonTracing.from_environment(environ),
    )
    return {body["metadata"]["name"]: body for body in bodies}


def test_the_operator_and_the_daemon_run_the_trees_images(upgrade: Upgrade) -> None:
    install, current = upgrade.install, upgrade.current

    def operator_rolled() -> list[dict[str, Any]] | None:
        pods = install.operator_pods()
        new = [p for p in pods if p["spec"]["containers"][0]["image"] == current["operator"].ref]
        return pods if len(pods) == len(new) == 1 and _ready(pods[0]) else None

    wait(operator_rolled, "one Ready operator pod, of the tree's image", timeout=240)

    def rendered_and_rolled() -> dict[str, dict[str, Any]] | None:
        rendered = _rendered(install)
        stored = {name: install.get("daemonset", "-n", NAMESPACE, name) for name in rendered}
        if not all(s and daemonset.up_to_date(s, rendered[n]) for n, s in stored.items()):
            return None
        if not all(daemonset.rolled_out(s) for s in stored.values()):
            return None
        pods = install.daemon_pods()
        if not pods or not all(_daemon_image(p) == current["daemon"].ref for p in pods):
            return None
        return stored if all(_ready(p) for p in pods) else None

    try:
        stored = wait(rendered_and_rolled, "the DaemonSets the tree's operator renders", 300)
    finally:
        upgrade.sampling.set()
    assert set(stored) == {DAEMON_SET, CONSUMER_DS}
    # The node had a Ready daemon at every sample through the upgrade.
    assert upgrade.ready_daemons, "no sample taken"
    assert min(upgrade.ready_daemons) >= 1, upgrade.ready_daemons
    serving = stored[DAEMON_SET]
    assert not daemonset.predates_roles(serving)
    containers = serving["spec"]["template"]["spec"]["containers"]
    assert containers[0]["image"] == current["daemon"].ref
    # One daemon on the node, of its role in the tree's rendering; the last release's pod
    # is gone and the other role's DaemonSet runs none here.
    pods = install.daemon_pods()
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    labels = pods[0]["metadata"]["labels"]
    assert labels.get(daemonset.ROLE_LABEL) == upgrade.role, labels
    mine, other = (
        (DAEMON_SET, CONSUMER_DS) if upgrade.role == "serving" else (CONSUMER_DS, DAEMON_SET)
    )
    assert stored[mine]["status"].get("desiredNumberScheduled") == 1
    assert stored[other]["status"].get("desiredNumberScheduled") == 0
    # The operator created the consumer DaemonSet and changed the old one only after it.
    uid = _thundercluster(install)["metadata"]["uid"]
    said = [
        (e["reason"], e["message"])
        for reason in ("DaemonSetCreated", "DaemonSetDeferred", "DaemonSetUpdated")
        for e in install.events("default", reason)
        if e["involvedObject"].get("uid") == uid
    ]
    assert ("DaemonSetCreated", f"DaemonSet {NAMESPACE}/{CONSUMER_DS} created") in said, said
    deferred = (
        f"DaemonSet {NAMESPACE}/{DAEMON_SET} deferred until every consumer daemon pod is ready"
    )
    assert ("DaemonSetDeferred", deferred) in said, said
    assert ("DaemonSetUpdated", f"DaemonSet {NAMESPACE}/{DAEMON_SET} updated") in said, said

    def daemon_ready() -> bool:
        conditions = _thundercluster(install).get("status", {}).get("conditions", [])
        return any(c["type"] == "DaemonReady" and c["status"] == "True" for c in conditions)

    wait(daemon_ready, "the ThunderCluster's DaemonReady condition True", timeout=60)


def test_the_held_pod_kept_running_and_reading_its_files(upgrade: Upgrade) -> None:
    install = upgrade.install
    pod = running(install, HELD)
    assert pod is not None, install.get("pod", HELD)
    status = pod["status"]["containerStatuses"][0]
    assert status["containerID"] == upgrade.held_container
    assert status["restartCount"] == 0

    # Reads after the upgrade, and none failed before or after.
    def read_since_upgrade() -> list[str] | None:
        reads = [ln for ln in pod_logs(install.node, HELD).splitlines() if ln.startswith("read ")]
        after = [ln for ln in reads if int(ln.split()[1]) > upgrade.upgraded_at + 5]
        return reads if len(after) >= 3 else None

    reads = wait(read_since_upgrade, f"{HELD} reading after the upgrade", timeout=60)
    assert all(ln.endswith(" ok") for ln in reads), [ln for ln in reads if "FAILED" in ln]
    # A process started in it now gets the files and the preloaded library too.
    check_injected(install, _exec_injected(install, HELD))
    # Its claim is still prepared: its Client and its enrollment are where they were.
    clients = install.clients("default")
    assert len(clients) == 1, clients
    assert len(install.cdi_specs()) == 1


def test_a_new_claim_after_the_upgrade_runs_with_its_files(upgrade: Upgrade) -> None:
    install = upgrade.install
    name = AFTER
    pod = run_pod(install.node, _claim_pod(install, name, INJECTED), timeout=240)
    logs = pod_logs(install.node, name)
    assert pod["status"]["phase"] == "Succeeded", logs
    check_injected(install, logs)
    install.node.kubectl("delete", "pod", name, "--wait=true")


def test_no_prepare_failed(upgrade: Upgrade) -> None:
    install = upgrade.install
    assert install.failed_prepares("default", upgrade.kubelet_log_start, (HELD, AFTER)) == []


def test_deleting_the_pods_and_claims_leaks_nothing(upgrade: Upgrade) -> None:
    install = upgrade.install
    install.node.kubectl("delete", "pod", HELD, "--wait=true", timeout=120)
    install.node.kubectl("delete", "resourceclaimtemplate", TEMPLATE, "--wait=true")
    install.wait_claims_gone("default")
    wait(lambda: not install.cdi_specs(), "the claims' CDI specs removed")
    assert install.fake.admin.leaks() == []
    assert install.failed_prepares("default", upgrade.kubelet_log_start, (HELD, AFTER)) == []


def _operator_deployment(install: Install) -> dict[str, Any]:
    items = install.get("deployments", "-n", NAMESPACE)["items"]
    assert len(items) == 1, [d["metadata"]["name"] for d in items]
    return dict(items[0])


def _thundercluster(install: Install) -> dict[str, Any]:
    items = install.get("thunderclusters")["items"]
    assert len(items) == 1, [c["metadata"]["name"] for c in items]
    return dict(items[0])


def _claim_pod(install: Install, name: str, script: str) -> dict[str, Any]:
    return stock_pod(
        name,
        install.images["stock"].ref,
        script,
        container={"resources": {"claims": [{"name": "gpu", "request": "gpu"}]}},
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}],
    )


def _exec_injected(install: Install, pod: str) -> str:
    """``INJECTED`` run in the running pod, its standard error with its output (where the
    preloaded library's line goes)."""
    script = "{\n" + INJECTED + "\n} 2>&1"
    return install.node.kubectl("exec", "-n", "default", pod, "--", "/bin/sh", "-c", script)
