"""The chart's pre-delete hook, `helm uninstall`'s guard, on the local control plane.

The chart is installed as its README says (token Secret first) with the webhook off
(nothing here may dial its Service's cluster IP, see test_packaging_helm_install), and
the operator runs as a process with what the rendered Deployment gives its container,
under the operator ServiceAccount's own token, as in
test_packaging_install_with_operator.

There is no kubelet, so the hook Job's Pod would never run. The test does what helm and
the Job would do instead: it creates the hook's ServiceAccount, ClusterRole and
ClusterRoleBinding from the hook manifests the release stored (`helm get hooks`), then
runs the script stored in the hook's ConfigMap with the Job container's environment,
under the hook ServiceAccount's own token (a TokenRequest, what the Pod would mount)
against the API server. What that ServiceAccount may do is checked with
`kubectl auth can-i --as` it.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from hack.cluster import Cluster
from hack.fake_thunder import FakeThunderProcess, start_fake_thunder
from hack.testbed.kube import Kube, wait_for
from hack.testbed.operator import API_TOKEN, THUNDER_API, OperatorProcess
from tests.integration.packaging.releasekit import clear_finalizers, uninstall
from tests.integration.packaging.releasekit import helm as _helm

CHART = "charts/thunder-device-plugin"
OPERATOR_FINALIZER = "thundercompute.com/operator"
HOOK = "helm.sh/hook"

Run = Callable[..., subprocess.CompletedProcess[str]]


@dataclass
class Installed:
    release: str
    namespace: str
    fullname: str
    tc_name: str
    env: dict[str, str]
    hooks: list[dict[str, Any]]
    operator: OperatorProcess
    run_hook: Run


def _token(kube: Kube, namespace: str, sa: str) -> str:
    request: Any = {"spec": {"expirationSeconds": 3600}}
    status = kube.core.create_namespaced_service_account_token(sa, namespace, request).status
    assert status is not None
    return str(status.token)


def _token_kubeconfig(cluster: Cluster, user: str, token: str, path: Path) -> Path:
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    server = admin["clusters"][0]["cluster"]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "local", "cluster": server}],
                "users": [{"name": user, "user": {"token": token}}],
                "contexts": [{"name": user, "context": {"cluster": "local", "user": user}}],
                "current-context": user,
            }
        )
    )
    path.chmod(0o600)
    return path


def _server_and_ca(cluster: Cluster, folder: Path) -> tuple[str, Path]:
    """The API server's URL and a file with its CA, as a Pod's mounted ca.crt."""
    admin = yaml.safe_load(cluster.kubeconfig.read_text())["clusters"][0]["cluster"]
    ca = folder / "ca.crt"
    if "certificate-authority-data" in admin:
        ca.write_bytes(base64.b64decode(admin["certificate-authority-data"]))
    else:
        ca.write_bytes(Path(admin["certificate-authority"]).read_bytes())
    return str(admin["server"]), ca


def _plain_env(container: dict[str, Any], namespace: str, pod: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
        else:
            field = item["valueFrom"]["fieldRef"]["fieldPath"]
            env[item["name"]] = {"metadata.name": pod, "metadata.namespace": namespace}[field]
    return env


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def _client(kube: Kube, namespace: str, fullname: str) -> str:
    """A Client made as the chart's daemon makes one (only the driver writes Clients)."""
    name = f"c-{uuid.uuid4().hex[:6]}"
    body: dict[str, Any] = {
        "apiVersion": THUNDER_API,
        "kind": "Client",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "claim": {"namespace": namespace, "name": "claim", "uid": "u-1"},
            "nodeName": "n1",
            "zone": {"name": "z", "id": "z1"},
            "gpuType": "A6000",
            "gpuCount": 1,
        },
    }
    api = k8s_config.new_client_from_config(config_file=str(kube.kubeconfig))  # type: ignore[no-untyped-call]
    api.set_default_header(
        "Impersonate-User", f"system:serviceaccount:{namespace}:{fullname}-daemon"
    )
    api.set_default_header("Impersonate-Extra-authentication.kubernetes.io%2fnode-name", "n1")
    k8s.CustomObjectsApi(api).create_namespaced_custom_object(
        "thundercompute.com", "v1alpha1", namespace, "clients", body
    )
    return name


def _clients(kube: Kube) -> list[str]:
    return [
        f"{c['metadata']['namespace']}/{c['metadata']['name']}"
        for c in kube.list_objects(THUNDER_API, "Client")
    ]


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
    release = namespace = f"tdu-{suffix}"
    fullname = f"{release}-thunder-device-plugin"
    tc_name = f"thunder-{suffix}"
    env = {**os.environ, **cluster.env()}
    zone_id = fake.admin.add_zone(f"zone-{suffix}")
    fake.admin.add_host(zone_id, "A6000", 2)
    work = tmp_path_factory.mktemp("uninstall-hook")

    subprocess.run(["kubectl", "create", "namespace", namespace], env=env, check=True)
    subprocess.run(
        ["kubectl", "-n", namespace, "create", "secret", "generic", "thunder-api",
         f"--from-literal=THUNDER_API_TOKEN={API_TOKEN}"],
        env=env, check=True, capture_output=True,
    )  # fmt: skip
    done = _helm(
        env, "install", release, CHART, "--namespace", namespace,
        "--set", f"thunderCluster.name={tc_name}",
        "--set", f"thunder.apiURL={fake.base_url}",
        "--set", f"thunder.artifactBaseURL={fake.artifact_base_url}",
        "--set", "webhook.enabled=false",
        check=False,
    )  # fmt: skip
    operator: OperatorProcess | None = None
    hooks: list[dict[str, Any]] = []
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        manifest = _helm(env, "get", "manifest", release, "--namespace", namespace).stdout
        deployment = _one([d for d in yaml.safe_load_all(manifest) if d], "Deployment")
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        process_env = _plain_env(container, namespace, f"{deployment['metadata']['name']}-local")
        operator_kubeconfig = _token_kubeconfig(
            cluster,
            pod["serviceAccountName"],
            _token(kube, namespace, pod["serviceAccountName"]),
            work / "operator.kubeconfig",
        )
        operator = OperatorProcess(operator_kubeconfig, container.get("args") or [], work)
        with pytest.MonkeyPatch.context() as patch:
            for key, value in process_env.items():
                patch.setenv(key, value)
            operator.start()

        # What helm creates before the Job, in the hooks' weight order.
        stored = _helm(env, "get", "hooks", release, "--namespace", namespace).stdout
        hooks = [d for d in yaml.safe_load_all(stored) if d]
        hook_objects = [h for h in hooks if h["metadata"]["annotations"][HOOK] == "pre-delete"]
        for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
            kube.create(_one(hook_objects, kind))
        job = _one(hook_objects, "Job")
        job_pod = job["spec"]["template"]["spec"]
        (job_container,) = job_pod["containers"]
        (mount,) = job_container["volumeMounts"]
        script_data = _one(hook_objects, "ConfigMap")["data"]
        assert job_container["command"][0] == "python"
        script_path = Path(job_container["command"][1])
        assert script_path.parent == Path(mount["mountPath"])
        script = work / script_path.name
        script.write_text(script_data[script_path.name])
        hook_token = work / "token"
        hook_token.write_text(_token(kube, namespace, job_pod["serviceAccountName"]))
        server, ca = _server_and_ca(cluster, work)
        job_env = _plain_env(job_container, namespace, f"{job['metadata']['name']}-local")

        def run_hook(**overrides: str) -> subprocess.CompletedProcess[str]:
            # The Pod's environment; the in-cluster address, token and CA as files.
            hook_env = {"PATH": os.environ["PATH"], **job_env, **overrides}
            hook_env.update(
                {"TDP_API_SERVER": server, "TDP_TOKEN_FILE": str(hook_token),
                 "TDP_CA_FILE": str(ca)}
            )  # fmt: skip
            return subprocess.run(
                [sys.executable, str(script)],
                env=hook_env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )

        yield Installed(release, namespace, fullname, tc_name, env, hooks, operator, run_hook)
    finally:
        if operator is not None:
            operator.stop()
        for hook in hooks:
            if hook["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                kube.delete("rbac.authorization.k8s.io/v1", hook["kind"], hook["metadata"]["name"])
        # The hook's script ran as the tests above.
        uninstall(env, kube, release, namespace, tc_name)
        kube.delete(THUNDER_API, "ThunderCluster", tc_name)
        for leftover in kube.list_objects(THUNDER_API, "Client", namespace):
            kube.delete(THUNDER_API, "Client", leftover["metadata"]["name"], namespace)
        kube.core.delete_namespace(namespace)


def _can(installed: Installed, verb: str, resource: str, namespace: str | None = None) -> bool:
    sa = f"system:serviceaccount:{installed.namespace}:{installed.fullname}-pre-delete"
    args = ["kubectl", "auth", "can-i", verb, resource, f"--as={sa}"]
    if namespace is not None:
        args += ["--namespace", namespace]
    done = subprocess.run(args, env=installed.env, capture_output=True, text=True, check=False)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode == 0


def test_the_hook_service_account_may_only_find_and_delete_thunderclusters_and_list_clients(
    installed: Installed,
) -> None:
    assert _can(installed, "delete", "thunderclusters.thundercompute.com")
    assert _can(installed, "list", "thunderclusters.thundercompute.com")
    assert _can(installed, "list", "clients.thundercompute.com")
    # Nothing that would let it release a finalizer, revoke a Client or read the token.
    assert not _can(installed, "update", "thunderclusters.thundercompute.com")
    assert not _can(installed, "patch", "thunderclusters.thundercompute.com")
    assert not _can(installed, "delete", "clients.thundercompute.com", installed.namespace)
    assert not _can(installed, "get", "secrets", installed.namespace)
    assert not _can(installed, "delete", "deployments.apps", installed.namespace)


def test_the_operator_holds_the_thundercluster_with_its_finalizer(
    installed: Installed, kube: Kube
) -> None:
    def held() -> bool:
        tc = kube.get(THUNDER_API, "ThunderCluster", installed.tc_name)
        return tc is not None and OPERATOR_FINALIZER in (tc["metadata"].get("finalizers") or [])

    wait_for(held, "the operator's finalizer on the ThunderCluster", timeout=120)


def test_the_hook_refuses_while_a_client_exists(installed: Installed, kube: Kube) -> None:
    name = _client(kube, installed.namespace, installed.fullname)
    try:
        done = installed.run_hook()
    finally:
        kube.delete(THUNDER_API, "Client", name, installed.namespace)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"refusing to uninstall release {installed.release}" in done.stderr
    assert f"{installed.namespace}/{name}" in done.stderr
    assert "would strand them" in done.stderr
    assert "--no-hooks" in done.stderr
    # Nothing was deleted.
    tc = kube.get(THUNDER_API, "ThunderCluster", installed.tc_name)
    assert tc is not None
    assert not tc["metadata"].get("deletionTimestamp")


def test_the_hook_deletes_the_thundercluster_and_the_running_operator_releases_it(
    installed: Installed, kube: Kube
) -> None:
    wait_for(lambda: not _clients(kube), "no Client left on the control plane", timeout=30)
    done = installed.run_hook()
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"deleted thundercluster/{installed.tc_name}" in done.stdout
    assert "the operator released the ThunderCluster" in done.stdout
    assert kube.get(THUNDER_API, "ThunderCluster", installed.tc_name) is None
    records = installed.operator.log_records()
    assert any(r.get("message") == "stopped reconciling ThunderCluster" for r in records)


def test_a_second_run_finds_nothing_to_release(installed: Installed) -> None:
    done = installed.run_hook()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nothing to release" in done.stdout


def test_without_a_running_operator_the_hook_fails_saying_what_to_do(
    installed: Installed, kube: Kube
) -> None:
    installed.operator.stop()
    ours, theirs = f"held-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"
    for name, release in ((ours, installed.release), (theirs, f"not-{installed.release}")):
        kube.create(
            {
                "apiVersion": THUNDER_API,
                "kind": "ThunderCluster",
                "metadata": {
                    "name": name,
                    # As an operator that ran and stopped left it.
                    "finalizers": [OPERATOR_FINALIZER],
                    "annotations": {
                        "meta.helm.sh/release-name": release,
                        "meta.helm.sh/release-namespace": installed.namespace,
                    },
                },
                "spec": {"thunder": {"secretName": "thunder-api"}},
            }
        )
    try:
        done = installed.run_hook(TDP_TIMEOUT_SECONDS="3")
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"deleted thundercluster/{ours}" in done.stdout
        assert theirs not in done.stdout + done.stderr
        message = done.stderr
        assert f"the operator has not released thundercluster/{ours}" in message
        assert f"thundercluster/{ours}: finalizers {OPERATOR_FINALIZER}" in message
        operator = f"{installed.fullname}-operator"
        assert f"kubectl -n {installed.namespace} get deployment {operator}" in message
        assert f"helm uninstall {installed.release} -n {installed.namespace} --no-hooks" in (
            message
        )
        assert "kubectl patch thundercluster <name> --type=json" in message
        held = kube.get(THUNDER_API, "ThunderCluster", ours)
        assert held is not None
        assert held["metadata"].get("deletionTimestamp")
        other = kube.get(THUNDER_API, "ThunderCluster", theirs)
        assert other is not None
        assert not other["metadata"].get("deletionTimestamp")
    finally:
        for name in (ours, theirs):
            clear_finalizers(kube, name)
            kube.delete(THUNDER_API, "ThunderCluster", name)
