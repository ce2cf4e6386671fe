"""The `vm` test chart on a real node: what the driver does for a KubeVirt VM, without KubeVirt.

KubeVirt cannot run on this machine, so its part is played by the test, as far as the
driver can tell: a stand-in of KubeVirt's VirtualMachine and VirtualMachineInstance CRDs
(`hack/node/kubevirt-crds.yaml`: KubeVirt's group, version, kinds, plurals and scope)
lets the apiserver accept the chart's objects, and the test creates what virt-controller
would make from the VirtualMachine: its VirtualMachineInstance (owned by the VM) and the
virt-launcher pod (owned by the VMI, labelled `kubevirt.io=virt-launcher` and
`vm.kubevirt.io/name`, with the VMI's `resourceClaims` and its setup Secret volume). That
pod runs on the real kubelet with the stock Debian image; its `compute` container waits
for the setup files as the chart's cloud-init does.

The driver is installed once for the module; each test installs the chart afresh in its
own namespace (and, where it needs one, starts the VM) and removes it all after, so the
tests run alone or in any order. The chart installs with the values a user gives
(`--set gpu.type=A6000 --set gpu.count=1`) and its VirtualMachine is stored as rendered;
the virt-launcher pod's claim is prepared as a VM's: a `<claim>-thunder-setup` Secret
with the minted enrollment token and the guest install script, owned by the claim; the
kubelet fills the pod's optional Secret volume with it (the deadlock the chart's comment
avoids); no CDI device, no Thunder client exchanged, the `Client` says VirtualMachine;
the daemon's own credentials may write that Secret but no other and read none; stopping
the VM (its VMI deleted, the garbage collector removing the pod) unprepares the claim:
the daemon deletes the Secret while the claim still exists and the fake's audit shows
no leaked enrollment; `helm uninstall` leaves nothing.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from hack import image as image_builder
from hack.node.chart import KUBEVIRT_CRDS, NAMESPACE, VM_CHART, Install, installed, wait
from hack.node.launcher import Node
from tests.e2e.node.conftest import pod_logs, run_pod

VM_NS = "chart-vm"
VM = "thunder-vm"  # the README's release name; the chart names the VM after it
CLAIM = f"{VM}-claim"
SETUP_SECRET = f"{CLAIM}-thunder-setup"
LAUNCHER = f"virt-launcher-{VM}-0"
SETUP_MOUNT = "/mnt/thunder-setup"  # where the chart's cloud-init mounts the Secret
DRIVER = "thundercompute.com"

# The compute container stands in for the guest: it waits for the setup Secret's files
# as the chart's cloud-init does, shows what it got (never the token itself) and keeps
# running, as a VM does: the kubelet unprepares a pod's claims once it has finished.
GUEST_DONE = "guest: done waiting for the setup files"
GUEST = rf"""
for _ in $(seq 200); do
  [ -s {SETUP_MOUNT}/install-thunder-client.sh ] && break
  sleep 1
done
ls -1 {SETUP_MOUNT}/
echo "token-sha256=$(cat {SETUP_MOUNT}/enrollment-token | sha256sum | cut -d ' ' -f 1)"
grep -E '^(token_file|export|curl)' {SETUP_MOUNT}/install-thunder-client.sh
[ -e /etc/thunder ] && echo "/etc/thunder present" || echo "no /etc/thunder"
echo "LD_PRELOAD=${{LD_PRELOAD:-}}"
env | sort
echo "{GUEST_DONE}"
exec sleep 3600
"""

# Run with the daemon's ServiceAccount on the node, so the request carries the same
# credential the daemon pod has (a kubelet-projected token bound to a pod on this node).
PROBE = r"""
import json, os, ssl, sys, urllib.error, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
token = open(sa + "/token").read()
base = "https://%s:%s" % (os.environ["KUBERNETES_SERVICE_HOST"],
                          os.environ["KUBERNETES_SERVICE_PORT"])
def call(what, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method, headers={
        "Authorization": "Bearer " + token, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=30) as answer:
            code, message = answer.status, ""
    except urllib.error.HTTPError as err:
        code, message = err.code, json.loads(err.read() or b"{}").get("message", "")
    print(json.dumps({"what": what, "code": code, "message": message}))
ns = sys.argv[1]
secrets = "/api/v1/namespaces/%s/secrets" % ns
call("create-other", "POST", secrets, {"apiVersion": "v1", "kind": "Secret",
     "metadata": {"name": "not-a-setup-secret", "namespace": ns},
     "stringData": {"k": "v"}})
call("get-setup", "GET", secrets + "/" + sys.argv[2])
call("list", "GET", secrets)
"""


@pytest.fixture(scope="module")
def install(
    real_node: Node,
    node_images: dict[str, image_builder.BuiltImage],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Install]:
    with installed(real_node, node_images, tmp_path_factory.mktemp("node-vm-chart")) as done:
        real_node.kubectl("apply", "-f", str(KUBEVIRT_CRDS))
        real_node.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", "-f", str(KUBEVIRT_CRDS)
        )
        try:
            yield done
        finally:
            # While the driver runs: a launcher pod a failed test left is unprepared first.
            real_node.kubectl(
                "delete", "namespace", VM_NS, "--ignore-not-found", "--timeout=120s",
                check=False, timeout=150,
            )  # fmt: skip
            real_node.kubectl("delete", "-f", str(KUBEVIRT_CRDS), "--ignore-not-found", check=False)


@dataclass(frozen=True)
class VmRelease:
    install: Install
    output: str
    """What `helm install` of the vm chart printed."""


@pytest.fixture
def vm_release(install: Install) -> Iterator[VmRelease]:
    """The vm chart installed afresh, as the README says, in its own namespace; removed
    after the test with whatever the test made there."""
    wait(lambda: install.get("deviceclass", "thunder-gpu-a6000"), "DeviceClass thunder-gpu-a6000")
    install.node.kubectl("create", "namespace", VM_NS)
    try:
        out = install.helm(
            "install", VM, str(VM_CHART), "-n", VM_NS, "--set", "gpu.type=A6000",
            "--set", "gpu.count=1",
        )  # fmt: skip
        yield VmRelease(install, out)
    finally:
        _remove_vm(install)


@pytest.fixture
def launched(vm_release: VmRelease) -> str:
    """The VM started: its instance and virt-launcher pod made as virt-controller would;
    the guest stand-in's output once it has read the setup files."""
    install = vm_release.install
    install.apply("vmi", _vmi(_vm(install)))
    vmi = install.get("virtualmachineinstances.kubevirt.io", "-n", VM_NS, VM)
    install.apply("virt-launcher", _launcher(vmi, install.images["stock"].ref))
    logs: str = wait(lambda: _guest_output(install), "the launcher pod's guest stand-in", 300)
    return logs


def _remove_vm(install: Install) -> None:
    """Take away everything of the VM a test left, in the order a user's cluster would: the
    instance and its launcher pod (the kubelet unprepares the claim while the driver
    runs), the release, the namespace. Then Thunder holds no enrollment of it."""
    kubectl = install.node.kubectl
    kubectl(
        "delete", "virtualmachineinstances.kubevirt.io", "-n", VM_NS, VM, "--ignore-not-found",
        check=False,
    )  # fmt: skip
    kubectl(
        "delete", "pod", "-n", VM_NS, LAUNCHER, "--ignore-not-found", "--timeout=120s",
        check=False, timeout=150,
    )  # fmt: skip
    wait(lambda: _client(install) is None, "the VM claim unprepared (its Client removed)")
    install.helm("uninstall", VM, "-n", VM_NS, "--wait", "--ignore-not-found")
    install.wait_claims_gone(VM_NS)
    kubectl(
        "delete", "namespace", VM_NS, "--ignore-not-found", "--timeout=120s",
        check=False, timeout=150,
    )  # fmt: skip
    wait(lambda: not install.fake.admin.leaks(), "no enrollment of the VM left at Thunder")


def _vm(install: Install) -> dict[str, Any]:
    vm = install.get("virtualmachines.kubevirt.io", "-n", VM_NS, VM)
    assert vm, f"VirtualMachine {VM_NS}/{VM} not found"
    return dict(vm)


def _claim(install: Install) -> dict[str, Any] | None:
    claim = install.get("resourceclaim", "-n", VM_NS, CLAIM)
    return dict(claim) if claim else None


def _client(install: Install) -> dict[str, Any] | None:
    clients = install.get("clients.thundercompute.com", "-n", VM_NS) or {"items": []}
    items = clients["items"]
    assert len(items) <= 1, items
    return dict(items[0]) if items else None


def _setup_secret(install: Install) -> dict[str, Any] | None:
    secret = install.get("secret", "-n", VM_NS, SETUP_SECRET)
    return dict(secret) if secret else None


def _token(install: Install, token_id: str) -> dict[str, Any]:
    tokens = install.fake.admin.state().get("enrollmentTokens", [])
    found = [t for t in tokens if t["enrollmentTokenId"] == token_id]
    assert len(found) == 1, f"Thunder knows no enrollment token {token_id}"
    return dict(found[0])


def _vmi(vm: dict[str, Any]) -> dict[str, Any]:
    """What virt-controller makes of a running VirtualMachine: its instance, named after it,
    owned by it, with the template's labels and spec."""
    template = vm["spec"]["template"]
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {
            "name": VM,
            "namespace": VM_NS,
            "labels": {**template["metadata"]["labels"], "vm.kubevirt.io/name": VM},
            "ownerReferences": [_owner(vm)],
        },
        "spec": template["spec"],
    }


def _owner(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _launcher(vmi: dict[str, Any], image: str) -> dict[str, Any]:
    """The instance's virt-launcher pod as virt-controller makes it (owner, labels, claims,
    Secret volumes), with the stock image and the guest's wait in its compute container."""
    spec = vmi["spec"]
    # A VMI secret volume becomes a pod secret volume (virtiofs shares it from there).
    volumes = [{"name": v["name"], "secret": v["secret"]} for v in spec["volumes"] if "secret" in v]
    claims = spec["resourceClaims"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": LAUNCHER,
            "namespace": VM_NS,
            "labels": {
                **vmi["metadata"]["labels"],
                "kubevirt.io": "virt-launcher",
                "kubevirt.io/created-by": vmi["metadata"]["uid"],
            },
            "ownerReferences": [_owner(vmi)],
        },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": claims,
            "volumes": volumes,
            "containers": [
                {
                    "name": "compute",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", GUEST],
                    # Referenced by the container, so any CDI device the driver answered
                    # for the claim would reach it: a VM's answer carries none.
                    "resources": {"claims": [{"name": c["name"]} for c in claims]},
                    "volumeMounts": [
                        {"name": v["name"], "mountPath": SETUP_MOUNT, "readOnly": True}
                        for v in volumes
                    ],
                }
            ],
        },
    }


def _daemon_log(install: Install) -> str:
    pods = [p["metadata"]["name"] for p in install.daemon_pods()]
    return "\n".join(
        install.node.kubectl("logs", "-n", NAMESPACE, name, "--tail=40", check=False)
        for name in pods
    )


def _guest_output(install: Install) -> str | None:
    """The compute container's output once it has read the setup files, while it runs."""
    pod = install.get("pod", "-n", VM_NS, LAUNCHER) or {}
    phase = (pod.get("status") or {}).get("phase")
    assert phase in (None, "Pending", "Running"), f"the launcher pod is {phase}: {pod['status']}"
    logs = install.node.kubectl("logs", "-n", VM_NS, LAUNCHER, check=False)
    return logs if GUEST_DONE in logs else None


def test_the_vm_chart_installs_and_its_virtualmachine_is_stored_as_rendered(
    vm_release: VmRelease,
) -> None:
    install, out = vm_release.install, vm_release.output
    assert "STATUS: deployed" in out, out
    assert f"ResourceClaim {CLAIM}" in out, out
    assert f"Secret {SETUP_SECRET}" in out, out
    rendered = {
        doc["kind"]: doc
        for doc in yaml.safe_load_all(install.helm("get", "manifest", VM, "-n", VM_NS))
        if doc
    }
    assert set(rendered) == {"ResourceClaim", "VirtualMachine"}, sorted(rendered)
    vm = _vm(install)
    # The stand-in CRD keeps every field: what KubeVirt would read is what the chart wrote.
    assert vm["spec"] == rendered["VirtualMachine"]["spec"]
    template = vm["spec"]["template"]["spec"]
    assert template["resourceClaims"] == [{"name": "gpu", "resourceClaimName": CLAIM}]
    volumes = {v["name"]: v for v in template["volumes"]}
    assert volumes["thunder-setup"]["secret"] == {"secretName": SETUP_SECRET, "optional": True}
    assert "gpus" not in template["domain"]["devices"]  # the GPU is reached over the network
    # The chart's NOTES commands work against the stand-in (short names vm, vmi).
    listed = install.node.kubectl("get", "vm,vmi", VM, "-n", VM_NS, check=False)
    assert VM in listed, listed
    claim = _claim(install)
    assert claim is not None
    request = claim["spec"]["devices"]["requests"][0]["exactly"]
    assert (request["deviceClassName"], request["count"]) == ("thunder-gpu-a6000", 1)
    # Nothing is prepared before a virt-launcher pod uses the claim.
    assert not (claim.get("status") or {}).get("allocation"), claim.get("status")
    assert _setup_secret(install) is None
    assert _client(install) is None


def test_the_virt_launcher_pods_claim_is_prepared_as_a_vms(install: Install, launched: str) -> None:
    logs = launched

    # The daemon's setup Secret: the minted token and the guest script, owned by the claim.
    secret = _setup_secret(install)
    assert secret is not None, f"no Secret {SETUP_SECRET}\n{logs}\n{_daemon_log(install)}"
    claim = _claim(install)
    assert claim is not None
    meta = secret["metadata"]
    assert [(o["kind"], o["name"], o["uid"]) for o in meta["ownerReferences"]] == [
        ("ResourceClaim", CLAIM, claim["metadata"]["uid"])
    ]
    assert meta["labels"][f"{DRIVER}/claim-uid"] == claim["metadata"]["uid"]
    assert meta["annotations"][f"{DRIVER}/node-name"] == install.node.config.name
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert sorted(data) == ["enrollment-token", "install-thunder-client.sh"]
    token_id = meta["annotations"][f"{DRIVER}/enrollment-token-id"]
    minted = _token(install, token_id)
    assert data["enrollment-token"] == minted["enrollmentToken"]
    # A client token for this claim, never exchanged: the guest enrolls itself.
    assert (minted["role"], minted["gpuType"], minted["gpuCount"]) == ("client", "A6000", 1)
    assert minted["state"] == "unspent", minted["state"]
    script = data["install-thunder-client.sh"]
    assert minted["enrollmentToken"] not in script
    assert f"THUNDER_CENTRAL_URL='{install.fake.base_url}'" in script, script
    assert f"curl -fsSL '{install.fake.installer_url}'" in script, script

    # The kubelet filled the pod's optional Secret volume once the daemon wrote it.
    assert "enrollment-token\ninstall-thunder-client.sh\n" in logs, logs
    digest = hashlib.sha256(minted["enrollmentToken"].encode()).hexdigest()
    assert f"token-sha256={digest}" in logs, logs
    assert f'token_file="${{THUNDER_ENROLLMENT_TOKEN_FILE:-{SETUP_MOUNT}/' in logs, logs
    # No CDI device for a VM: nothing of a pod's injection reached the container.
    assert "no /etc/thunder" in logs, logs
    assert "LD_PRELOAD=\n" in logs, logs
    assert not [p for p in install.cdi_specs() if claim["metadata"]["uid"] in p.name]
    leaked = [s for s in install.secrets() if s in logs]
    assert not leaked, "a credential reached the launcher pod's environment or output"

    # The claim's Client names the VM, and no Thunder client was created for it.
    client = _client(install)
    assert client is not None
    spec = client["spec"]
    assert (spec["consumerKind"], spec["consumerName"]) == ("VirtualMachine", VM), spec
    assert spec["enrollmentTokenId"] == token_id
    assert client["status"]["phase"] == "Enrolled", client["status"]
    assert not client["status"].get("clientId"), client["status"]
    assert SETUP_SECRET in client["status"]["message"]
    clients = install.fake.admin.state()["clients"]
    assert not [c["clientId"] for c in clients if c["enrollmentTokenId"] == token_id]
    # Until a guest spends it, the audit counts the VM's token: the check below can fail.
    assert [leak["enrollmentTokenId"] for leak in install.fake.admin.leaks()] == [token_id]


def test_the_daemons_credentials_write_only_setup_secrets_and_read_none(
    install: Install, launched: str
) -> None:
    assert _setup_secret(install) is not None, "the VM's setup Secret, which the probe asks for"
    daemon = wait(install.ready_daemon_pod, "a Ready daemon pod")
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "daemon-credentials", "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "serviceAccountName": daemon["spec"]["serviceAccountName"],
            "nodeName": install.node.config.name,
            "containers": [
                {
                    "name": "probe",
                    "image": install.images["daemon"].ref,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", PROBE, VM_NS, SETUP_SECRET],
                }
            ],
        },
    }
    pod = run_pod(install.node, probe, timeout=180)
    logs = pod_logs(install.node, "daemon-credentials", NAMESPACE)
    install.node.kubectl("delete", "pod", "-n", NAMESPACE, "daemon-credentials", "--wait=true")
    assert pod["status"]["phase"] == "Succeeded", logs
    answers = {a["what"]: a for a in (json.loads(ln) for ln in logs.splitlines() if ln.strip())}
    other = answers["create-other"]
    assert other["code"] in (403, 422), other
    assert "the daemon writes only <claim>-thunder-setup Secrets" in other["message"], other
    assert answers["get-setup"]["code"] == 403, answers["get-setup"]
    assert answers["list"]["code"] == 403, answers["list"]
    assert install.get("secret", "-n", VM_NS, "not-a-setup-secret") is None


def test_stopping_the_vm_unprepares_its_claim_and_revokes_the_enrollment(
    install: Install, launched: str
) -> None:
    """virt-controller deletes a stopped VM's instance; the garbage collector removes the
    virt-launcher pod it owns, and the kubelet unprepares the claim."""
    secret = _setup_secret(install)
    assert secret is not None
    token_id = secret["metadata"]["annotations"][f"{DRIVER}/enrollment-token-id"]
    install.node.kubectl("delete", "virtualmachineinstances.kubevirt.io", "-n", VM_NS, VM)
    wait(
        lambda: install.get("pod", "-n", VM_NS, LAUNCHER) is None,
        "the garbage collector to remove the virt-launcher pod",
    )
    wait(lambda: _setup_secret(install) is None, f"Secret {SETUP_SECRET} deleted at unprepare")
    # The daemon deleted it, not the garbage collector: its owner, the claim, is still there.
    claim = _claim(install)
    assert claim is not None
    assert not claim["metadata"].get("deletionTimestamp"), claim
    wait(lambda: _client(install) is None, "the VM claim's Client removed")
    assert _token(install, token_id)["state"] == "revoked"
    assert install.fake.admin.leaks() == []


def test_helm_uninstall_leaves_no_vm_object_claim_or_enrollment(
    install: Install, vm_release: VmRelease
) -> None:
    install.helm("uninstall", VM, "-n", VM_NS, "--wait")
    wait(lambda: _claim(install) is None, f"ResourceClaim {CLAIM} removed")
    assert install.get("virtualmachines.kubevirt.io", "-n", VM_NS)["items"] == []
    install.wait_claims_gone(VM_NS)
    assert _setup_secret(install) is None
    assert install.fake.admin.leaks() == []
