"""Pods and VMs on a client-only node: prepare, repeat, repair, unprepare, through the real
scheduler, the kubelet stand-in and a real daemon process."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hack.fake_thunder import FakeThunderProcess
from hack.testbed.daemon import (
    CLIENT_API,
    RESOURCE,
    NodeHarness,
    Workloads,
    ZonePool,
    enrolled_record,
    files_under,
    mints,
    secrets_of,
)
from hack.testbed.kube import Kube, wait_for

CONFIG_KEYS = {
    "deviceId",
    "clientId",
    "orgId",
    "gpuType",
    "gpuCount",
    "centralApiUrl",
    "authToken",
    "claims",
    "enableGrpcTls",
    "thunderdDiscoveryEnabled",
    "telemetryCollector",
}


@pytest.fixture(scope="module")
def node(kube: Kube, fake: FakeThunderProcess, pool: ZonePool) -> Iterator[NodeHarness]:
    with NodeHarness(kube, fake, zone=pool.zone) as harness:
        harness.daemon.start().wait_serving()
        harness.kubelet.wait_registered("thundercompute.com")
        yield harness


@pytest.fixture(scope="module")
def pods(kube: Kube, namespace: str, pool: ZonePool) -> Workloads:
    return Workloads(kube, namespace, pool)


def _client(kube: Kube, namespace: str, claim_uid: str) -> dict[str, Any] | None:
    return kube.get(CLIENT_API, "Client", f"claim-{claim_uid}", namespace)


def _wait_no_client(kube: Kube, namespace: str, claim_uid: str) -> None:
    """The claim's record is removed right after the unprepare's answer (the pod may be
    gone a moment before)."""
    wait_for(lambda: _client(kube, namespace, claim_uid) is None, "the Client record removed")


def _events(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    return kube.list_objects("v1", "Event", namespace)


def test_a_pod_gets_a_client_config_and_a_valid_cdi_spec_without_any_token(
    kube: Kube,
    fake: FakeThunderProcess,
    pool: ZonePool,
    node: NodeHarness,
    pods: Workloads,
    cdi_check: Path,
) -> None:
    writes_before = len(fake.admin.writes())
    name, _ = pods.create(node, count=2)
    pod = pods.wait_running(node, name)

    client = enrolled_record(kube, pods.namespace, pod.claim_uid)
    assert client["metadata"]["finalizers"] == ["thundercompute.com/client-cleanup"]
    spec, status = client["spec"], client["status"]
    assert spec["claim"] == {
        "namespace": pods.namespace,
        "name": pod.claim_name,
        "uid": pod.claim_uid,
    }
    assert (spec["nodeName"], spec["zone"]["name"], spec["zone"]["id"]) == (
        node.name,
        pool.zone,
        pool.zone_id,
    )
    assert (spec["gpuType"], spec["gpuCount"], spec["consumerKind"]) == ("A6000", 2, "Pod")
    assert spec["consumerName"] == name
    assert status["phase"] == "Enrolled"

    config_path = node.daemon.state_dir / "claims" / pod.claim_uid / "config.json"
    config = json.loads(config_path.read_text())
    assert set(config) == CONFIG_KEYS
    assert config["clientId"] == config["deviceId"] == status["clientId"] == spec["clientId"]
    assert (config["gpuType"], config["gpuCount"]) == ("A6000", 2)
    assert config["centralApiUrl"] == fake.base_url
    assert config["telemetryCollector"] == "https://telemetry.example.test:2096"

    # One mint, one exchange, named after the pod; the fake's client is live.
    new_writes = fake.admin.writes()[writes_before:]
    assert [w["path"] for w in new_writes if w["method"] == "POST"] == [
        "/api/v1/enrollment-tokens",
        "/api/v1/enrollment-tokens/enroll",
    ]
    assert new_writes[0]["body"] == {
        "zoneId": pool.zone_id,
        "role": "client",
        "gpuType": "A6000",
        "gpuCount": 2,
    }
    assert new_writes[1]["body"] == {"hostname": name}
    assert {w["userAgent"].split(" ")[-1] for w in new_writes} == {"(daemon)"}

    cdi_id = f"thundercompute.com/gpu=claim-{pod.claim_uid}"
    assert node.kubelet.cdi_ids(pod.uid) == {pod.claim_uid: [cdi_id, cdi_id]}
    oci = node.root / "oci.json"
    oci.write_text(
        json.dumps(
            {
                "ociVersion": "1.2.0",
                "process": {"args": ["sh"], "cwd": "/", "env": ["PATH=/usr/bin:/bin"]},
                "root": {"path": "rootfs"},
            }
        )
    )
    checked = subprocess.run(
        [str(cdi_check), "--spec-dir", str(node.daemon.cdi_dir), "--oci-spec", str(oci), cdi_id],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr
    injected = json.loads(checked.stdout)
    mounts = {m["destination"]: m["source"] for m in injected["mounts"]}
    assert mounts["/etc/thunder/config.json"] == str(config_path)
    assert Path(mounts["/etc/thunder/libthunder.so"]).read_bytes()[:4] == b"\x7fELF"
    env = injected["process"]["env"]
    assert "LD_PRELOAD=/etc/thunder/libthunder.so" in env
    assert f"THUNDER_RESOURCE_CLAIM_UID={pod.claim_uid}" in env

    secrets = secrets_of(fake)
    leaked_into = {
        "CDI dir": "\n".join(
            p.read_text(errors="replace") for p in files_under(node.daemon.cdi_dir)
        ),
        "Client": json.dumps(client),
        "events": json.dumps(_events(kube, pods.namespace)),
        "daemon log": node.daemon.log_text(),
    }
    for where, text in leaked_into.items():
        for secret in secrets:
            assert secret not in text, f"a credential leaked into the {where}"

    pods.delete(name)
    pods.wait_gone(node, name)
    _wait_no_client(kube, pods.namespace, pod.claim_uid)
    assert not config_path.parent.exists()
    assert not list(files_under(node.daemon.cdi_dir))
    assert fake.admin.leaks() == []
    assert fake.admin.audit()["orphanClients"] == []
    assert node.daemon.journal_entries() == []


def test_a_virt_launcher_pod_gets_the_setup_secret_and_no_cdi_device(
    kube: Kube, fake: FakeThunderProcess, node: NodeHarness, pods: Workloads
) -> None:
    writes_before = len(fake.admin.writes())
    name, _ = pods.create(node, vm=True)
    pod = pods.wait_running(node, name)
    assert node.kubelet.cdi_ids(pod.uid) == {pod.claim_uid: []}

    secret = kube.get("v1", "Secret", f"{pod.claim_name}-thunder-setup", pods.namespace)
    assert secret is not None
    assert set(secret["data"]) == {"enrollment-token", "install-thunder-client.sh"}
    [owner] = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "ResourceClaim",
        pod.claim_name,
        pod.claim_uid,
    )
    assert (owner["controller"], owner["blockOwnerDeletion"]) == (False, False)
    client = _client(kube, pods.namespace, pod.claim_uid)
    assert client is not None
    assert (client["spec"]["consumerKind"], client["spec"]["consumerName"]) == (
        "VirtualMachine",
        f"vm-{name}",
    )
    # The VM enrolls itself: minted, never exchanged by the daemon; nothing on the node.
    posted = [w["path"] for w in fake.admin.writes()[writes_before:] if w["method"] == "POST"]
    assert posted == ["/api/v1/enrollment-tokens"]
    assert not list(files_under(node.daemon.cdi_dir))
    assert not (node.daemon.state_dir / "claims" / pod.claim_uid).exists()

    pods.delete(name)
    pods.wait_gone(node, name)
    assert kube.get("v1", "Secret", f"{pod.claim_name}-thunder-setup", pods.namespace) is None
    _wait_no_client(kube, pods.namespace, pod.claim_uid)
    assert fake.admin.leaks() == []


def test_repeated_prepare_answers_the_same_with_one_enrollment_and_repairs_files(
    kube: Kube, fake: FakeThunderProcess, node: NodeHarness, pods: Workloads
) -> None:
    name, _ = pods.create(node)
    pod = pods.wait_running(node, name)
    daemon = node.daemon
    spec_file = daemon.cdi_dir / f"thundercompute.com-gpu_claim-{pod.claim_uid}.json"
    spec_content = spec_file.read_bytes()
    first = daemon.prepare(pods.namespace, pod.claim_name, pod.claim_uid)
    writes_before = len(fake.admin.writes())

    # Same answer, nothing written to Thunder.
    again = daemon.prepare(pods.namespace, pod.claim_name, pod.claim_uid)
    assert again == first
    assert again.error == ""
    assert mints(fake, writes_before) == []

    # A CDI spec removed behind the daemon's back is written again by the next prepare.
    spec_file.unlink()
    assert daemon.prepare(pods.namespace, pod.claim_name, pod.claim_uid) == first
    assert spec_file.read_bytes() == spec_content

    # A wiped CDI directory (a reboot empties /var/run/cdi) is rebuilt at start-up.
    shutil.rmtree(daemon.cdi_dir)
    daemon.restart().wait_serving()
    wait_for(spec_file.exists, "the CDI spec rebuilt at start-up")
    assert spec_file.read_bytes() == spec_content
    assert mints(fake, writes_before) == []

    # config.json gone: the credential cannot be recovered, so the claim is enrolled anew
    # and the old client revoked; the kubelet gets the same answer.
    config_path = daemon.state_dir / "claims" / pod.claim_uid / "config.json"
    old_client = json.loads(config_path.read_text())["clientId"]
    config_path.unlink()
    assert daemon.prepare(pods.namespace, pod.claim_name, pod.claim_uid) == first
    new_client = json.loads(config_path.read_text())["clientId"]
    assert new_client != old_client
    assert len(mints(fake, writes_before)) == 1
    client = _client(kube, pods.namespace, pod.claim_uid)
    assert client is not None
    assert client["spec"]["clientId"] == new_client
    clients = {c["clientId"]: c for c in fake.admin.state()["clients"]}
    assert clients[old_client]["decommissionedAt"] is not None
    assert clients[new_client]["decommissionedAt"] is None

    pods.delete(name)
    pods.wait_gone(node, name)
    assert fake.admin.leaks() == []


def test_unprepare_of_a_claim_missing_from_the_checkpoint_uses_its_client_record(
    kube: Kube, fake: FakeThunderProcess, node: NodeHarness, pods: Workloads
) -> None:
    name, _ = pods.create(node)
    pod = pods.wait_running(node, name)
    daemon = node.daemon
    daemon.stop()
    (daemon.state_dir / "checkpoint.json").unlink()
    daemon.start().wait_serving()

    pods.delete(name)
    pods.wait_gone(node, name)
    _wait_no_client(kube, pods.namespace, pod.claim_uid)
    assert not (daemon.state_dir / "claims" / pod.claim_uid).exists()
    assert not list(files_under(daemon.cdi_dir))
    assert fake.admin.leaks() == []


def test_a_claim_that_is_not_allocated_gets_a_clear_error(
    kube: Kube, node: NodeHarness, pods: Workloads, pool: ZonePool
) -> None:
    claim = kube.create(
        {
            "apiVersion": RESOURCE,
            "kind": "ResourceClaim",
            "metadata": {"name": "unallocated", "namespace": pods.namespace},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": pool.device_class}}]
                }
            },
        }
    )
    answer = node.daemon.prepare(pods.namespace, "unallocated", claim["metadata"]["uid"])
    assert answer.error == (
        f"claim {pods.namespace}/unallocated: not allocated (status.allocation is empty)"
    )
    assert list(answer.devices) == []
    metrics = node.daemon.metrics()
    assert metrics['thunder_dra_daemon_errors_total{operation="prepare",reason="claim"}'] >= 1
