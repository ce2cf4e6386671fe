"""The daemon's least privilege, with its real ServiceAccount token, on the local apiserver,
and the consumer role's pod under the API server's Pod Security admission.

The chart's ServiceAccounts, daemon RBAC and admission policies are rendered with
`helm template` and created in a fresh release namespace; the CRDs are the generated
ones. Each daemon identity is what a kubelet gives the daemon's Pod: a token from a
TokenRequest bound to a Pod object on a simulated Node, so the API server puts the
node's name in the credential. Nothing serves the webhook: every refusal here comes
from RBAC, the admission policies or the CRD's own rules.

The chart binds the `client-writers` policy cluster-wide (only the driver writes
Clients); here its binding is narrowed to the test's workload namespace so the other
tests sharing this control plane keep creating Clients as the admin.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from hack.cluster import Cluster, binaries
from hack.cluster.nodes import create_node, delete_node
from hack.fake_thunder import FakeThunderProcess
from hack.testbed.daemon import (
    CLIENT_API,
    NodeHarness,
    Workloads,
    ZonePool,
)
from hack.testbed.kube import Kube, wait_for
from release import bundle
from thunder_dra.api.thundercluster import ThunderClusterSpec
from thunder_dra.controllers.process.policies import apply_policies, operator_identity, rendered
from thunder_dra.controllers.shared.ownership import ThunderClusterRef
from thunder_dra.controllers.workload import daemonset
from thunder_dra.kube.admissionpolicy import SUFFIXES
from thunder_dra.kube.events import EventRecorder
from thunder_dra.kube.provenance import ProvenanceKey
from thunder_dra.kube.transport import build_client
from thunder_dra.plugin.claims.records import Records
from thunder_dra.plugin.state.checkpoint import Consumer, PreparedClaim
from thunder_dra.thunder import Secret

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "thunder-device-plugin"
GROUP, VERSION = "thundercompute.com", "v1alpha1"
NODE_EXTRA = "authentication.kubernetes.io/node-name"
SHOWN = ("serviceaccounts.yaml", "rbac-daemon.yaml", "admission-policies.yaml")
CLUSTER_KINDS = (
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)


@dataclass
class Install:
    namespace: str
    workloads: str
    other: str
    daemon_sa: str
    objects: list[dict[str, Any]]


def _render(release: str, namespace: str) -> list[dict[str, Any]]:
    args = [str(binaries() / "helm"), "template", release, str(CHART), "--namespace", namespace]
    for name in SHOWN:
        args += ["--show-only", f"templates/{name}"]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _status(err: ApiException) -> tuple[int, str]:
    body = err.body.decode() if isinstance(err.body, bytes) else str(err.body or "")
    try:
        message = str(json.loads(body).get("message", body))
    except ValueError:
        message = body
    return int(err.status or 0), message


def _refused(call: Any, *args: Any, **kwargs: Any) -> tuple[int, str]:
    try:
        call(*args, **kwargs)
    except ApiException as err:
        return _status(err)
    raise AssertionError(f"{getattr(call, '__name__', call)} was allowed")


@pytest.fixture(scope="module")
def install(kube: Kube, crds: None) -> Iterator[Install]:
    release = f"sec{uuid.uuid4().hex[:5]}"
    with (
        kube.namespace("sec") as namespace,
        kube.namespace("secwl") as workloads,
        kube.namespace("secother") as other,
    ):
        objects = _render(release, namespace)
        for obj in objects:
            if obj["kind"] == "ValidatingAdmissionPolicyBinding" and obj["metadata"][
                "name"
            ].endswith("-client-writers"):
                obj["spec"]["matchResources"] = {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": workloads}}
                }
        try:
            for obj in objects:
                kube.create(obj)
            sa = next(
                o["metadata"]["name"]
                for o in objects
                if o["kind"] == "ServiceAccount" and o["metadata"]["name"].endswith("-daemon")
            )
            yield Install(namespace, workloads, other, sa, objects)
        finally:
            for obj in objects:
                if obj["kind"] in CLUSTER_KINDS:
                    kube.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


@dataclass
class DaemonIdentity:
    node: str
    api: k8s.ApiClient
    kubeconfig: Path

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api)


def bound_token(kube: Kube, install: Install, node: str) -> str:
    """What the kubelet projects into the daemon's Pod: a token bound to that Pod."""
    pod: Any = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"daemon-{node}"},
        "spec": {
            "nodeName": node,
            "serviceAccountName": install.daemon_sa,
            "containers": [{"name": "daemon", "image": "thunder-dra-daemon:test"}],
        },
    }
    created: Any = kube.core.create_namespaced_pod(install.namespace, pod)
    request: Any = {
        "spec": {
            "expirationSeconds": 3600,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": created.metadata.name,
                "uid": created.metadata.uid,
            },
        }
    }
    answer: Any = kube.core.create_namespaced_service_account_token(
        install.daemon_sa, install.namespace, request
    )
    return str(answer.status.token)


def token_kubeconfig(cluster: Cluster, token: str, path: Path) -> Path:
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    server = admin["clusters"][0]["cluster"]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "local", "cluster": server}],
                "users": [{"name": "daemon", "user": {"token": token}}],
                "contexts": [{"name": "daemon", "context": {"cluster": "local", "user": "daemon"}}],
                "current-context": "daemon",
            }
        )
    )
    path.chmod(0o600)
    return path


def daemon_identity(
    kube: Kube, cluster: Cluster, install: Install, node: str, folder: Path
) -> DaemonIdentity:
    kubeconfig = token_kubeconfig(cluster, bound_token(kube, install, node), folder / node)
    api = k8s_config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    return DaemonIdentity(node, api, kubeconfig)


@pytest.fixture(scope="module")
def nodes(kube: Kube) -> Iterator[tuple[str, str]]:
    names = (f"sec-a-{uuid.uuid4().hex[:5]}", f"sec-b-{uuid.uuid4().hex[:5]}")
    for name in names:
        create_node(kube.core, name, zone="sec-zone")
    try:
        yield names
    finally:
        for name in names:
            delete_node(kube.core, name)


@pytest.fixture(scope="module")
def daemons(
    kube: Kube,
    cluster: Cluster,
    install: Install,
    nodes: tuple[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[DaemonIdentity, DaemonIdentity]:
    folder = tmp_path_factory.mktemp("daemon-tokens")
    a, b = (daemon_identity(kube, cluster, install, n, folder) for n in nodes)
    _wait_policies_enforced(kube, a, b, install)
    return a, b


def _by_policy(err: ApiException) -> bool:
    return err.status == 403 and "ValidatingAdmissionPolicy" in _status(err)[1]


def _wait_policies_enforced(
    kube: Kube, a: DaemonIdentity, b: DaemonIdentity, install: Install
) -> None:
    """Policies reach the API server's admission a moment after they are created, each
    on its own: every policy the tests rely on is probed until it refuses."""
    name = f"probe-{uuid.uuid4().hex[:6]}"
    body: Any = {"metadata": {"name": name}, "data": {}}

    def secrets_refused() -> bool:
        try:
            a.core.create_namespaced_secret(install.workloads, body)
        except ApiException as err:
            return _by_policy(err)
        try:
            a.core.delete_namespaced_secret(name, install.workloads)
        except ApiException as err:
            # The policies came into force between the create and the delete, and now
            # refuse this delete of a Secret that is not a setup Secret.
            return _by_policy(err)
        return False

    def clients_refused() -> bool:
        # A daemon writing another node's Client (daemon-clients), and anyone but the
        # driver writing one (client-writers); one that got through is removed again.
        attempts: list[tuple[Any, dict[str, Any]]] = [
            (lambda body: _create_client(a, body), client_body(install.workloads, b.node)),
            (kube.create, client_body(install.workloads, a.node)),
        ]
        for create, client in attempts:
            try:
                create(client)
            except ApiException as err:
                if _by_policy(err):
                    continue
                raise
            kube.delete(
                client["apiVersion"], "Client", client["metadata"]["name"], install.workloads
            )
            return False
        return True

    wait_for(secrets_refused, "the Secret admission policies enforced", timeout=60)
    wait_for(clients_refused, "the Client admission policies enforced", timeout=60)


def make_claim(kube: Kube, namespace: str, name: str) -> str:
    """A real ResourceClaim: a setup Secret it owns is not garbage-collected."""
    claim = kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "thunder-gpu-x"}}]
                }
            },
        }
    )
    return str(claim["metadata"]["uid"])


def setup_secret(
    namespace: str, claim: str, claim_uid: str, node: str, value: str = "dG9rZW4="
) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": f"{claim}-thunder-setup",
            "namespace": namespace,
            "labels": {"thundercompute.com/claim-uid": claim_uid},
            "annotations": {"thundercompute.com/node-name": node},
            "ownerReferences": [
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "name": claim,
                    "uid": claim_uid,
                    "controller": False,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "data": {"enrollment-token": value},
    }


def client_body(namespace: str, node: str, token_id: str = "tok-1") -> dict[str, Any]:
    uid = str(uuid.uuid4())
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Client",
        "metadata": {"name": f"claim-{uid}", "namespace": namespace},
        "spec": {
            "claim": {"namespace": namespace, "name": "c", "uid": uid},
            "nodeName": node,
            "zone": {"name": "z", "id": "z1"},
            "gpuType": "A6000",
            "gpuCount": 1,
            "enrollmentTokenId": token_id,
        },
    }


def _create_client(daemon: DaemonIdentity, body: dict[str, Any]) -> dict[str, Any]:
    created: Any = daemon.custom.create_namespaced_custom_object(
        GROUP, VERSION, body["metadata"]["namespace"], "clients", body
    )
    return dict(created)


def _patch_client(api: k8s.ApiClient, body: dict[str, Any], patch: dict[str, Any]) -> None:
    k8s.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, body["metadata"]["namespace"], "clients", body["metadata"]["name"], patch
    )


# -- the credential ----------------------------------------------------------------------


def test_a_pod_bound_token_carries_its_node_name(daemons: tuple[DaemonIdentity, ...]) -> None:
    for daemon in daemons:
        request: Any = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        review: Any = k8s.AuthenticationV1Api(daemon.api).create_self_subject_review(request)
        extra = review.status.user_info.extra or {}
        assert extra.get(NODE_EXTRA) == [daemon.node]


# -- Secrets -----------------------------------------------------------------------------


def test_the_daemon_reads_no_secret_anywhere(
    kube: Kube, install: Install, daemons: tuple[DaemonIdentity, DaemonIdentity]
) -> None:
    a, _ = daemons
    victim: Any = {"metadata": {"name": "victim"}, "stringData": {"password": "hunter2"}}
    kube.core.create_namespaced_secret(install.other, victim)
    mine = setup_secret(install.workloads, "read-me", str(uuid.uuid4()), a.node)
    a.core.create_namespaced_secret(install.workloads, mine)
    for namespace, name in (
        (install.other, "victim"),
        (install.workloads, "read-me-thunder-setup"),
    ):
        status, _ = _refused(a.core.read_namespaced_secret, name, namespace)
        assert status == 403
    assert _refused(a.core.list_secret_for_all_namespaces)[0] == 403
    assert _refused(a.core.list_namespaced_secret, install.namespace)[0] == 403
    assert _refused(a.core.list_namespaced_secret, install.other, watch=True)[0] == 403
    # A patch answers with the object, even one that changes nothing: refused for a
    # Secret not its own, so it cannot read through writes either.
    noop: Any = [{"op": "test", "path": "/metadata/name", "value": "victim"}]
    for dry_run in (None, "All"):
        status, message = _refused(
            a.core.patch_namespaced_secret, "victim", install.other, noop, dry_run=dry_run
        )
        assert status == 403
        assert "ValidatingAdmissionPolicy" in message
        status, _ = _refused(
            a.core.delete_namespaced_secret, "victim", install.other, dry_run=dry_run
        )
        assert status == 403


def test_the_daemon_cannot_overwrite_or_delete_an_arbitrary_secret(
    kube: Kube, install: Install, daemons: tuple[DaemonIdentity, DaemonIdentity]
) -> None:
    a, _ = daemons
    uid = str(uuid.uuid4())
    # One with an ordinary name, and one named like a setup Secret but made by someone else.
    plain: Any = {"metadata": {"name": "app-config"}, "stringData": {"key": "value"}}
    lookalike: Any = {"metadata": {"name": "db-thunder-setup"}, "stringData": {"key": "value"}}
    for body in (plain, lookalike):
        kube.core.create_namespaced_secret(install.workloads, body)
    for name in ("app-config", "db-thunder-setup"):
        replacement = setup_secret(
            install.workloads, name.removesuffix("-thunder-setup"), uid, a.node
        )
        replacement["metadata"]["name"] = name
        status, _ = _refused(a.core.replace_namespaced_secret, name, install.workloads, replacement)
        assert status == 403
        assert _refused(a.core.delete_namespaced_secret, name, install.workloads)[0] == 403
        kept = kube.core.read_namespaced_secret(name, install.workloads)
        assert kept.data == {"key": "dmFsdWU="}
    # Nor create one that is not a claim's setup Secret.
    status, message = _refused(
        a.core.create_namespaced_secret,
        install.other,
        {"metadata": {"name": "planted"}, "data": {}},
    )
    assert status == 403
    assert "thunder-setup" in message
    unowned = setup_secret(install.workloads, "free", uid, a.node)
    unowned["metadata"]["ownerReferences"] = []
    status, message = _refused(a.core.create_namespaced_secret, install.workloads, unowned)
    assert (status, "owned by the ResourceClaim" in message) == (403, True)


def test_the_daemon_cannot_write_a_secret_for_another_node(
    kube: Kube, install: Install, daemons: tuple[DaemonIdentity, DaemonIdentity]
) -> None:
    a, b = daemons
    uid = make_claim(kube, install.workloads, "theirs")
    status, message = _refused(
        a.core.create_namespaced_secret,
        install.workloads,
        setup_secret(install.workloads, "elsewhere", uid, b.node),
    )
    assert status == 403
    assert "its own node" in message
    theirs = setup_secret(install.workloads, "theirs", uid, b.node)
    b.core.create_namespaced_secret(install.workloads, theirs)
    takeover = setup_secret(install.workloads, "theirs", uid, a.node, value="b3duZWQ=")
    status, _ = _refused(
        a.core.replace_namespaced_secret, "theirs-thunder-setup", install.workloads, takeover
    )
    assert status == 403
    for dry_run in (None, "All"):
        status, _ = _refused(
            a.core.delete_namespaced_secret,
            "theirs-thunder-setup",
            install.workloads,
            dry_run=dry_run,
        )
        assert status == 403
    # Its own node may replace and delete it: what a repeated prepare and unprepare do.
    again = setup_secret(install.workloads, "theirs", uid, b.node, value="YWdhaW4=")
    b.core.replace_namespaced_secret("theirs-thunder-setup", install.workloads, again)
    other_claim = setup_secret(install.workloads, "theirs", str(uuid.uuid4()), b.node)
    status, message = _refused(
        b.core.replace_namespaced_secret, "theirs-thunder-setup", install.workloads, other_claim
    )
    assert (status, "only for the claim" in message) == (403, True)
    b.core.delete_namespaced_secret("theirs-thunder-setup", install.workloads)


# -- Clients -----------------------------------------------------------------------------


def test_the_daemon_writes_only_its_own_nodes_clients(
    install: Install, daemons: tuple[DaemonIdentity, DaemonIdentity]
) -> None:
    a, b = daemons
    status, message = _refused(_create_client, a, client_body(install.workloads, b.node))
    assert status == 403
    assert "spec.nodeName is its own node" in message
    theirs = client_body(install.workloads, b.node)
    _create_client(b, theirs)
    name, ns = theirs["metadata"]["name"], install.workloads
    patches: list[dict[str, Any]] = [
        {"metadata": {"labels": {"x": "y"}}},
        {"metadata": {"finalizers": []}},
    ]
    for patch in patches:
        assert _refused(_patch_client, a.api, theirs, patch)[0] == 403
    status, _ = _refused(
        a.custom.patch_namespaced_custom_object_status,
        GROUP,
        VERSION,
        ns,
        "clients",
        name,
        {"status": {"phase": "Revoked"}},
    )
    assert status == 403
    status, _ = _refused(
        a.custom.delete_namespaced_custom_object, GROUP, VERSION, ns, "clients", name
    )
    assert status == 403
    b.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, "clients", name)


def test_only_the_driver_writes_clients_and_others_may_only_release_them(
    kube: Kube, install: Install, daemons: tuple[DaemonIdentity, DaemonIdentity]
) -> None:
    a, _ = daemons
    body = client_body(install.workloads, a.node)
    status, message = _refused(kube.create, dict(body))
    assert status == 403
    assert "Clients are written only by the driver" in message
    body["metadata"]["finalizers"] = ["thundercompute.com/client-cleanup"]
    _create_client(a, body)
    assert _refused(_patch_client, kube.api_client, body, {"spec": {"consumerName": "x"}})[0] == 403
    status, _ = _refused(
        _patch_client, kube.api_client, body, {"metadata": {"labels": {"forged": "1"}}}
    )
    assert status == 403
    status, _ = _refused(
        k8s.CustomObjectsApi(kube.api_client).patch_namespaced_custom_object_status,
        GROUP,
        VERSION,
        install.workloads,
        "clients",
        body["metadata"]["name"],
        {"status": {"orphanedSince": "2020-01-01T00:00:00Z"}},
    )
    assert status == 403
    # An administrator may release a Client (e.g. when purging the driver).
    _patch_client(kube.api_client, body, {"metadata": {"finalizers": None}})
    k8s.CustomObjectsApi(kube.api_client).delete_namespaced_custom_object(
        GROUP, VERSION, install.workloads, "clients", body["metadata"]["name"]
    )


def test_client_fields_are_immutable_without_the_webhook(
    install: Install, daemons: tuple[DaemonIdentity, DaemonIdentity]
) -> None:
    a, _ = daemons
    body = client_body(install.workloads, a.node, token_id="")
    _create_client(a, body)
    _patch_client(a.api, body, {"spec": {"enrollmentTokenId": "tok-9", "consumerName": "pod-1"}})
    for field, value in (
        ("gpuCount", 2),
        ("gpuType", "L4"),
        ("zone", {"name": "z2", "id": "z2"}),
        ("claim", {"namespace": install.workloads, "name": "other", "uid": "u"}),
        ("consumerKind", "VirtualMachine"),
        ("enrollmentTokenId", "tok-other"),
        ("consumerName", "pod-2"),
    ):
        status, message = _refused(_patch_client, a.api, body, {"spec": {field: value}})
        assert status == 422, (field, message)
        assert f"spec.{field}" in message, message
        assert "immutable" in message or "never change" in message, message
    a.custom.delete_namespaced_custom_object(
        GROUP, VERSION, install.workloads, "clients", body["metadata"]["name"]
    )


# -- the daemon still does its job ------------------------------------------------------


def test_the_daemon_prepares_and_unprepares_pods_and_vms_with_its_own_token(
    kube: Kube,
    cluster: Cluster,
    install: Install,
    fake: FakeThunderProcess,
    pool: ZonePool,
    daemons: tuple[DaemonIdentity, DaemonIdentity],
    tmp_path: Path,
) -> None:
    with NodeHarness(kube, fake, zone=pool.zone) as node:
        identity = daemon_identity(kube, cluster, install, node.name, tmp_path)
        node.daemon.kubeconfig = identity.kubeconfig
        node.daemon.start().wait_serving()
        node.kubelet.wait_registered("thundercompute.com")
        pods = Workloads(kube, install.workloads, pool)
        pod_name, _ = pods.create(node)
        vm_name, _ = pods.create(node, vm=True)
        pod = pods.wait_running(node, pod_name)
        vm = pods.wait_running(node, vm_name)
        for running in (pod, vm):
            client = kube.get(CLIENT_API, "Client", f"claim-{running.claim_uid}", install.workloads)
            assert client is not None
            assert client["spec"]["nodeName"] == node.name
        secret = kube.get("v1", "Secret", f"{vm.claim_name}-thunder-setup", install.workloads)
        assert secret is not None
        assert secret["metadata"]["annotations"]["thundercompute.com/node-name"] == node.name
        for running in (pod, vm):
            pods.delete(running.name)
            pods.wait_gone(node, running.name)
        assert kube.get("v1", "Secret", f"{vm.claim_name}-thunder-setup", install.workloads) is None
        names = [f"claim-{running.claim_uid}" for running in (pod, vm)]
        wait_for(
            lambda: all(
                kube.get(CLIENT_API, "Client", name, install.workloads) is None for name in names
            ),
            "the Clients removed after the unprepares",
        )
        log = node.daemon.log_text()
        assert "denied request" not in log, log[-3000:]
        assert "is forbidden" not in log, log[-3000:]


def _validations_by_suffix(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        suffix: o["spec"]["validations"]
        for o in objects
        if o["kind"] == "ValidatingAdmissionPolicy"
        for suffix in SUFFIXES
        if o["metadata"]["name"].endswith(f"-{suffix}")
    }


# -- OLM: the operator applies the policies itself -----------------------------------------


def test_the_operator_applies_the_policies_with_the_bundles_rights(
    kube: Kube, cluster: Cluster, install: Install, tmp_path: Path
) -> None:
    operator_sa = next(
        o["metadata"]["name"]
        for o in install.objects
        if o["kind"] == "ServiceAccount" and o["metadata"]["name"].endswith("-operator")
    )
    role = f"{install.namespace}-admission-policies"
    rbac: list[dict[str, Any]] = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": bundle.policy_rules(),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": operator_sa, "namespace": install.namespace}
            ],
        },
    ]
    identity = operator_identity(install.namespace, install.daemon_sa, operator_sa)
    for obj in rbac:
        kube.create(obj)
    request: Any = {"spec": {"expirationSeconds": 3600}}
    answer: Any = kube.core.create_namespaced_service_account_token(
        operator_sa, install.namespace, request
    )
    kubeconfig = token_kubeconfig(cluster, str(answer.status.token), tmp_path / "operator")
    names = identity.policy_names()

    async def apply() -> dict[str, str]:
        async with build_client(kubeconfig, user_agent="security-test") as operator_kube:
            return await apply_policies(operator_kube, identity)

    try:
        first = asyncio.run(apply())
        assert set(first.values()) == {"created"}
        assert len(first) == 2 * len(SUFFIXES)
        assert set(asyncio.run(apply()).values()) == {"unchanged"}
        # A policy weakened by hand is put back.
        weakened = names[0]
        kube.resource("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy").patch(
            name=weakened,
            body=[{"op": "remove", "path": "/spec/validations/1"}],
            content_type="application/json-patch+json",
        )
        third = asyncio.run(apply())
        assert third[f"ValidatingAdmissionPolicy/{weakened}"] == "updated"
        stored = kube.get("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy", weakened)
        assert stored is not None
        want = next(o for o in rendered(identity) if o["metadata"]["name"] == weakened)
        assert stored["spec"]["validations"] == want["spec"]["validations"]
        # Same rules as the chart's, for the same ServiceAccounts.
        chart = _validations_by_suffix(install.objects)
        ours = _validations_by_suffix(rendered(identity))
        assert chart == ours
    finally:
        for kind in ("ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy"):
            for name in names:
                kube.delete("admissionregistration.k8s.io/v1", kind, name)
        for obj in rbac:
            kube.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


def test_the_daemons_records_find_and_remove_only_their_own_setup_secrets(
    kube: Kube, install: Install, daemons: tuple[DaemonIdentity, DaemonIdentity]
) -> None:
    a, b = daemons
    uid = make_claim(kube, install.workloads, "records")
    body = setup_secret(install.workloads, "records", uid, b.node)
    body["metadata"]["annotations"]["thundercompute.com/enrollment-token-id"] = "et-1"
    b.core.create_namespaced_secret(install.workloads, body)
    key = ProvenanceKey(Secret("tcapi_security_test"))

    async def run() -> None:
        mine_kube = build_client(b.kubeconfig, user_agent="security-test")
        theirs_kube = build_client(a.kubeconfig, user_agent="security-test")
        async with mine_kube, theirs_kube:
            mine, theirs = (
                Records(
                    client,
                    node,
                    key,
                    events=EventRecorder(client, component="daemon", instance=node, scrub=str),
                )
                for client, node in ((mine_kube, b.node), (theirs_kube, a.node))
            )
            await check(mine, theirs)

    async def check(mine: Records, theirs: Records) -> None:
        ns = install.workloads
        assert await mine.guest_secret_exists(ns, "records", uid)
        assert not await mine.guest_secret_exists(ns, "records", "another-uid")
        assert not await theirs.guest_secret_exists(ns, "records", uid)
        assert not await theirs.delete_guest_secret(ns, "records", uid)
        assert not await mine.delete_guest_secret(ns, "records", uid, only_token_id="et-2")
        assert await mine.guest_secret_exists(ns, "records", uid)
        assert await mine.delete_guest_secret(ns, "records", uid, only_token_id="et-1")
        assert not await mine.guest_secret_exists(ns, "records", uid)

    asyncio.run(run())


def test_the_daemons_records_remove_its_client_under_the_policies(
    kube: Kube, install: Install, daemons: tuple[DaemonIdentity, DaemonIdentity]
) -> None:
    """The record's removal (its finalizer dropped, then deleted) with the daemon's own
    credentials, through RBAC and the admission policies, on the API server's JSON patch:
    a record already without its finalizer (a crash between the two steps, or an
    administrator's release) and one of another enrollment (``only_token_id``)."""
    _, b = daemons
    ns = install.workloads
    key = ProvenanceKey(Secret("tcapi_security_test"))
    claims = {name: make_claim(kube, ns, name) for name in ("rm-a", "rm-b", "rm-c")}

    def prepared(name: str) -> PreparedClaim:
        return PreparedClaim(
            uid=claims[name],
            namespace=ns,
            name=name,
            consumer=Consumer(kind="pod", name=name),
            zone_name="zone a",
            zone_id="z-1",
            gpu_type="A6000",
            gpu_count=1,
            devices=(),
            enrollment_token_id=f"et-{name}",
            client_id=f"c-{name}",
        )

    def record(name: str) -> dict[str, Any] | None:
        return kube.get(CLIENT_API, "Client", f"claim-{claims[name]}", ns)

    async def run() -> None:
        async with build_client(b.kubeconfig, user_agent="security-test") as client:
            records = Records(
                client,
                b.node,
                key,
                events=EventRecorder(client, component="daemon", instance=b.node, scrub=str),
            )
            for name in claims:
                await records.write_client(prepared(name))
            admin = kube.resource(CLIENT_API, "Client")
            # An administrator may release a Client (as make purge does).
            admin.patch(
                name=f"claim-{claims['rm-b']}",
                namespace=ns,
                body={"metadata": {"finalizers": None}},
                content_type="application/merge-patch+json",
            )
            assert await records.delete_client(ns, claims["rm-a"])
            assert record("rm-a") is None
            assert await records.delete_client(ns, claims["rm-b"])
            assert record("rm-b") is None
            assert not await records.delete_client(ns, claims["rm-c"], only_token_id="et-other")
            assert record("rm-c") is not None
            assert await records.delete_client(ns, claims["rm-c"], only_token_id="et-rm-c")
            assert record("rm-c") is None

    asyncio.run(run())


# -- the consumer role's pod under Pod Security Admission -------------------------------

BASELINE_CHECKS = (
    "privileged",
    "host namespaces",
    "hostPort",
    "capabilities",
    "seccompProfile",
    "procMount",
    "sysctls",
    "hostProcess",
    "seLinuxOptions",
    "appArmor",
)


def _daemon_pod(role: daemonset.Role, *, host_paths: bool = True) -> dict[str, Any]:
    """A Pod of `role`'s DaemonSet template as the operator renders it (default
    settings), on the namespace's default ServiceAccount; with `host_paths` false, its
    hostPath volumes are emptyDirs."""
    body = daemonset.render(
        ThunderClusterSpec(), "ignored", ThunderClusterRef("t", "u"), "default", role=role
    )
    template = body["spec"]["template"]
    spec = template["spec"]
    spec.pop("priorityClassName")
    if not host_paths:
        spec["volumes"] = [{"name": v["name"], "emptyDir": {}} for v in spec["volumes"]]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"daemon-{role.value}", "labels": template["metadata"]["labels"]},
        "spec": spec,
    }


def _pod_security(kube: Kube, namespace: str, pod: Any) -> str | None:
    """The API server's Pod Security refusal of `pod` (dry run), or None if admitted."""
    try:
        kube.core.create_namespaced_pod(namespace, pod, dry_run="All")
    except ApiException as err:
        status, message = _status(err)
        assert status == 403, message
        assert "violates PodSecurity" in message, message
        return message.split("violates PodSecurity", 1)[1]
    return None


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_the_consumer_pod_breaks_pod_security_only_by_its_host_directories(
    kube: Kube, level: str
) -> None:
    """Enforced by the API server (namespace label `pod-security.kubernetes.io/enforce`).

    The consumer pod meets `privileged` only, as any kubelet plugin must: its hostPath
    volumes are the one `baseline` finding. With them as emptyDirs it meets `baseline`,
    and `restricted` refuses nothing but running as root (the kubelet's directories are
    root's). The serving pod breaks `baseline` three ways."""
    with kube.namespace("psa") as namespace:
        kube.core.patch_namespace(
            namespace,
            {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": level}}},
        )
        consumer = _pod_security(kube, namespace, _daemon_pod(daemonset.Role.CONSUMER))
        assert consumer is not None
        # `baseline` says "hostPath volumes", `restricted` "restricted volume types ...
        # hostPath"; neither finds anything else but `restricted`'s running as root.
        assert "hostPath" in consumer, consumer
        assert not [c for c in BASELINE_CHECKS if c in consumer], consumer
        for allowed in ("allowPrivilegeEscalation", "unrestricted capabilities", "seccomp"):
            assert allowed not in consumer, consumer
        bare = _pod_security(
            kube, namespace, _daemon_pod(daemonset.Role.CONSUMER, host_paths=False)
        )
        serving = _pod_security(kube, namespace, _daemon_pod(daemonset.Role.SERVING))
        assert serving is not None
        for finding in ("privileged", "host namespaces", "hostPath"):
            assert finding in serving, serving
        if level == "baseline":
            assert bare is None, bare
        else:
            assert bare is not None
            assert "runAsNonRoot" in bare, bare
            assert "runAsUser=0" in bare, bare
            for allowed in (
                "allowPrivilegeEscalation",
                "unrestricted capabilities",
                "seccompProfile",
                "restricted volume types",
                *BASELINE_CHECKS,
            ):
                assert allowed not in bare, bare
