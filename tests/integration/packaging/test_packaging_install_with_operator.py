"""`helm install` with the webhook enabled, then the operator as the chart runs it.

The chart is installed in one step as its README says (token Secret first), pointed at
a fake Thunder on loopback. There is no kubelet, so the operator Pod never starts: the
test runs `python -m thunder_dra.controllers` itself with what the rendered Deployment
gives its container (environment, arguments, namespace, ThunderCluster name, Lease),
under the operator ServiceAccount's own token and with the webhook certificate Secret's
files where the Pod would mount them. Only the probe and metrics ports are free local
ports instead.

The webhook is reached the way the API server reaches it on this control plane: it
dials the webhook Service's cluster IP and port (127.254.0.0/24, loopback; there is no
kube-proxy), so the operator listens on exactly that address and port, standing in for
the Service's one endpoint. Nothing dials a private-range address. Where that port
cannot be bound (not root), the test does what test_packaging_helm_install does: it
deletes the webhook Service, so webhook calls fail inside the API server, and skips
the checks that need the webhook served.

Last, `ops/deploy.py uninstall` runs while the operator is up: it deletes the
ThunderCluster first, the operator releases its kopf finalizer, and the release goes.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from hack.cluster import Cluster
from hack.fake_thunder import FakeThunderProcess, start_fake_thunder
from hack.testbed.kube import Kube, wait_for
from hack.testbed.operator import (
    API_TOKEN,
    CLASS_LABELS,
    INVENTORY_LABELS,
    RESOURCE_API,
    THUNDER_API,
    OperatorEnv,
    OperatorProcess,
)
from ops import helm_test
from tests.integration.packaging.releasekit import helm as _helm
from tests.integration.packaging.releasekit import release_thundercluster, uninstall

REPO = Path(__file__).resolve().parents[3]
CHART = "charts/thunder-device-plugin"
OPERATOR_FINALIZER = "thundercompute.com/operator"


@dataclass
class Installed:
    release: str
    namespace: str
    fullname: str
    install_output: str
    env: dict[str, str]
    op: OperatorEnv
    zone: str
    webhook_served: bool


def _message(err: ApiException) -> str:
    body = err.body.decode() if isinstance(err.body, bytes) else str(err.body)
    return str(json.loads(body).get("message", body))


def _can_bind(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as err:
            if err.errno in (errno.EACCES, errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                return False
            raise
    return True


def _token_kubeconfig(kube: Kube, cluster: Cluster, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig with the ServiceAccount's token: what in-cluster configuration reads."""
    request: Any = {"spec": {"expirationSeconds": 3600}}
    status = kube.core.create_namespaced_service_account_token(sa, namespace, request).status
    assert status is not None
    token = status.token
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    server = admin["clusters"][0]["cluster"]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "local", "cluster": server}],
                "users": [{"name": sa, "user": {"token": token}}],
                "contexts": [{"name": sa, "context": {"cluster": "local", "user": sa}}],
                "current-context": sa,
            }
        )
    )
    path.chmod(0o600)
    return path


def _container_env(
    container: dict[str, Any], namespace: str, pod_name: str, mounts: dict[str, Path]
) -> dict[str, str]:
    """The container's environment as the kubelet would set it, paths mapped to `mounts`."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            value = str(item["value"])
        else:
            field = item["valueFrom"]["fieldRef"]["fieldPath"]
            value = {"metadata.name": pod_name, "metadata.namespace": namespace}[field]
        env[item["name"]] = str(mounts.get(value, value))
    return env


def _cleanup_driver_objects(kube: Kube, uid: str | None) -> None:
    """What the ThunderCluster owned, should the garbage collector not have got to it yet."""
    for kind, selector in (("ResourceSlice", INVENTORY_LABELS), ("DeviceClass", CLASS_LABELS)):
        for obj in kube.list_objects(RESOURCE_API, kind, label_selector=selector):
            owners = obj["metadata"].get("ownerReferences") or ()
            if uid is not None and any(ref.get("uid") == uid for ref in owners):
                kube.delete(RESOURCE_API, kind, obj["metadata"]["name"])


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeThunderProcess]:
    log_path = tmp_path_factory.mktemp("fake-thunder") / "fake-thunder.log"
    with start_fake_thunder(tokens=[API_TOKEN], log_path=log_path) as process:
        yield process


@pytest.fixture(scope="module")
def installed(
    cluster: Cluster,
    kube: Kube,
    fake: FakeThunderProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Installed]:
    suffix = uuid.uuid4().hex[:6]
    release = namespace = f"tdo-{suffix}"
    fullname = f"{release}-thunder-device-plugin"
    tc_name = f"thunder-{suffix}"
    env = {**os.environ, **cluster.env()}
    zone = f"zone-{suffix}"
    zone_id = fake.admin.add_zone(zone)
    fake.admin.add_host(zone_id, "A6000", 4)
    fake.admin.add_host(zone_id, "A6000", 2)

    # The Install section: the namespace and the token Secret first, then helm.
    subprocess.run(["kubectl", "create", "namespace", namespace], env=env, check=True)
    subprocess.run(
        [
            "kubectl",
            "-n",
            namespace,
            "create",
            "secret",
            "generic",
            "thunder-api",
            f"--from-literal=THUNDER_API_TOKEN={API_TOKEN}",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    done = _helm(
        env,
        "install",
        release,
        CHART,
        "--namespace",
        namespace,
        "--set",
        f"thunderCluster.name={tc_name}",
        "--set",
        f"thunder.apiURL={fake.base_url}",
        "--set",
        f"thunder.artifactBaseURL={fake.artifact_base_url}",
        check=False,
    )
    work = tmp_path_factory.mktemp("operator")
    operator: OperatorProcess | None = None
    uid: str | None = None
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        tc = kube.get(THUNDER_API, "ThunderCluster", tc_name)
        assert tc is not None
        uid = tc["metadata"]["uid"]

        manifest = _helm(env, "get", "manifest", release, "--namespace", namespace).stdout
        objects = [d for d in yaml.safe_load_all(manifest) if d]
        deployment = next(o for o in objects if o["kind"] == "Deployment")
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]

        # The webhook certificate Secret's files, where the Pod would mount them.
        certs = work / "serving-certs"
        certs.mkdir()
        secret = kube.core.read_namespaced_secret(f"{fullname}-webhook-tls", namespace)
        for key, value in (secret.data or {}).items():
            (certs / key).write_bytes(base64.b64decode(value))
        mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts") or []}
        assert mounts.get("/tmp/k8s-webhook-server/serving-certs") == "webhook-tls"
        process_env = _container_env(
            container,
            namespace,
            f"{deployment['metadata']['name']}-local",
            {"/tmp/k8s-webhook-server/serving-certs": certs},
        )
        assert process_env["THUNDER_CLUSTER_NAME"] == tc_name
        assert process_env["THUNDER_NAMESPACE"] == namespace

        # The Service's address and port stand in for its endpoint (module docstring).
        service = kube.core.read_namespaced_service(f"{fullname}-webhook", namespace)
        assert service.spec is not None
        assert service.spec.ports is not None
        cluster_ip = str(service.spec.cluster_ip)
        assert cluster_ip.startswith("127.254.0."), cluster_ip
        (port,) = service.spec.ports
        webhook_served = _can_bind(cluster_ip, port.port)
        if webhook_served:
            process_env["THUNDER_WEBHOOK_LISTEN"] = cluster_ip
            process_env["THUNDER_WEBHOOK_PORT"] = str(port.port)
        else:
            kube.core.delete_namespaced_service(f"{fullname}-webhook", namespace)
            process_env["THUNDER_WEBHOOK_LISTEN"] = "127.0.0.1"

        kubeconfig = _token_kubeconfig(
            kube, cluster, namespace, pod["serviceAccountName"], work / "operator.kubeconfig"
        )
        operator = OperatorProcess(kubeconfig, container.get("args") or [], work)
        with pytest.MonkeyPatch.context() as patch:
            for key, value in process_env.items():
                patch.setenv(key, value)
            operator.start()
        op = OperatorEnv(kube, cluster, fake, namespace, tc_name, operator)
        yield Installed(release, namespace, fullname, done.stdout, env, op, zone, webhook_served)
    finally:
        release_thundercluster(kube, tc_name)
        if operator is not None:
            operator.stop()
        uninstall(env, kube, release, namespace, tc_name)
        _cleanup_driver_objects(kube, uid)
        kube.core.delete_namespace(namespace)


def test_helm_installs_in_one_step_with_the_webhook_enabled(installed: Installed) -> None:
    assert "STATUS: deployed" in installed.install_output
    assert "WARNING: Secret" not in installed.install_output


def test_the_operator_is_ready_with_the_charts_settings(installed: Installed) -> None:
    op = installed.op
    assert op.operator.popen is not None
    assert op.operator.popen.poll() is None
    url = f"http://127.0.0.1:{op.operator.health_port}/readyz"
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
    # The leader reconciles once it holds the Lease, which may come after readiness.
    wait_for(
        lambda: any(
            r.get("message") == "reconciling ThunderCluster" for r in op.operator.log_records()
        ),
        "the operator reconciling the ThunderCluster",
        timeout=120,
    )
    # The chart's leader election, not --standalone: the operator holds the release's Lease.
    lease = op.kube.get("coordination.k8s.io/v1", "Lease", installed.fullname, op.namespace)
    assert lease is not None
    # Its identity is the pod name (POD_ID, here "<deployment>-local") and a suffix.
    assert "-local_" in str(lease["spec"]["holderIdentity"])
    assert lease["spec"]["leaseDurationSeconds"] == 15
    # kopf spawns the daemon and adds its finalizer in one event cycle, the patch after.
    wait_for(
        lambda: OPERATOR_FINALIZER in op.thundercluster()["metadata"].get("finalizers", []),
        "the operator's finalizer on the ThunderCluster",
        timeout=30,
    )


def test_the_seeded_inventory_is_published(installed: Installed) -> None:
    op = installed.op
    pool = f"{installed.zone}/a6000"
    wait_for(lambda: op.devices(pool), f"devices of pool {pool}", timeout=90)
    assert op.devices(pool) == [f"a6000-{i}" for i in range(6)]
    device_class = op.device_class("thunder-gpu-a6000")
    assert device_class is not None
    assert device_class["spec"]["extendedResourceName"] == "thundercompute.com/gpu-a6000"
    wait_for(
        lambda: op.condition("ThunderReachable").get("status") == "True",
        "ThunderReachable",
    )


def test_the_daemon_daemonset_is_rendered(installed: Installed) -> None:
    op = installed.op

    def rendered() -> dict[str, Any] | None:
        return op.kube.get("apps/v1", "DaemonSet", "thunder-dra-daemon", installed.namespace)

    daemonset = wait_for(rendered, "the daemon DaemonSet", timeout=90)
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == f"{installed.fullname}-daemon"
    owners = daemonset["metadata"]["ownerReferences"]
    assert [o["kind"] for o in owners] == ["ThunderCluster"]
    assert owners[0]["name"] == op.name
    env = {e["name"]: e for e in spec["containers"][0].get("env") or []}
    assert env["THUNDER_API_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "thunder-api"


def test_the_operator_serves_the_charts_webhook(installed: Installed) -> None:
    if not installed.webhook_served:
        pytest.skip("the webhook Service's port cannot be bound here (module docstring)")
    op = installed.op
    # An update (through the webhook, allowed: the spec is valid) asks for a pass.
    op.sync()
    other: dict[str, Any] = {
        "apiVersion": THUNDER_API,
        "kind": "ThunderCluster",
        "metadata": {"name": f"by-hand-{uuid.uuid4().hex[:6]}"},
        # Valid for the CRD's schema; only the webhook knows label keys and the singleton.
        "spec": {"daemon": {"nodeSelector": {"not a label key": "x"}}},
    }
    with pytest.raises(ApiException) as caught:
        op.kube.create(other)
    message = _message(caught.value)
    assert 'admission webhook "thunderclusters.thundercompute.com" denied the request' in (
        message
    ), message
    assert "spec.daemon.nodeSelector" in message


def test_the_charts_verify_check_passes(
    installed: Installed, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("KUBECONFIG", "PATH"):
        monkeypatch.setenv(key, installed.env[key])
    wait_for(lambda: installed.op.device_class("thunder-gpu-a6000"), "the A6000 DeviceClass")
    assert helm_test.run(installed.release, installed.namespace) == 0


def test_ops_uninstall_deletes_the_thundercluster_while_the_operator_runs(
    installed: Installed, kube: Kube
) -> None:
    op = installed.op
    env = {
        **installed.env,
        "RELEASE": installed.release,
        "NAMESPACE": installed.namespace,
        "YES": "1",
    }
    for name in ("FORCE", "THUNDER_API_TOKEN", "OPERATOR_WAIT"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-m", "ops.deploy", "uninstall"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert f"deleted thundercluster/{op.name}" in output
    assert "the operator released the ThunderCluster" in output
    assert "Removing that finalizer" not in output
    assert kube.get(THUNDER_API, "ThunderCluster", op.name) is None
    records = op.operator.log_records()
    assert any(r.get("message") == "stopped reconciling ThunderCluster" for r in records)
    status = _helm(
        installed.env, "status", installed.release, "-n", installed.namespace, check=False
    )
    assert status.returncode != 0
