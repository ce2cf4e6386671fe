"""The daemon's node side: start-up checks, enrollment of serving nodes, thunderd upkeep,
readiness and metrics, and client-only nodes that never enroll."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from hack.fake_thunder import FakeThunderProcess
from hack.testbed.daemon import NodeHarness, Workloads, ZonePool, mints
from hack.testbed.kube import Kube, wait_for

GPUS = ["NVIDIA RTX A6000"] * 4


def _hosts_of(fake: FakeThunderProcess, node: str) -> list[dict[str, object]]:
    return [h for h in fake.admin.state()["hosts"] if h["hostname"] == node]


def _token_state(fake: FakeThunderProcess, token_id: str) -> str:
    return str(fake.admin.token(token_id)["state"])


@pytest.fixture
def serving(kube: Kube, fake: FakeThunderProcess, pool: ZonePool) -> Iterator[NodeHarness]:
    with NodeHarness(kube, fake, zone=pool.zone, serving=True) as harness:
        harness.daemon.host.set_nvidia(gpus=GPUS)
        yield harness


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("old-driver", "NVIDIA driver 580.95.05 is too old: 580 < 610"),
        ("no-nvidia-smi", "nvidia-smi not found on the host"),
        ("driver-error", "nvidia-smi failed (exit 9): NVIDIA-SMI has failed"),
        ("no-zone", "has no topology.kubernetes.io/zone label"),
    ],
)
def test_a_serving_node_that_cannot_serve_stops_the_daemon_with_the_reason(
    kube: Kube, fake: FakeThunderProcess, setup: str, message: str
) -> None:
    writes_before = len(fake.admin.writes())
    with NodeHarness(kube, fake, zone=None if setup == "no-zone" else "z", serving=True) as node:
        host = node.daemon.host
        if setup == "old-driver":
            host.set_nvidia(gpus=GPUS, driver_version="580.95.05")
        elif setup == "driver-error":
            host.set_nvidia(mode="error", gpus=GPUS)
        elif setup == "no-zone":
            host.set_nvidia(gpus=GPUS)
        code = node.daemon.start().wait_exit()
        assert code == 1
        lines = node.daemon.log_text().strip().splitlines()
        assert lines[-1].startswith("thunder-daemon: serving node ")
        assert message in lines[-1]
        assert not node.daemon.registry_dir.exists() or not list(node.daemon.registry_dir.iterdir())
    assert fake.admin.writes()[writes_before:] == []


def test_a_serving_node_enrolls_once_and_keeps_thunderd_healthy(
    fake: FakeThunderProcess, pool: ZonePool, serving: NodeHarness
) -> None:
    daemon = serving.daemon
    writes_before = len(fake.admin.writes())
    daemon.start().wait_serving()
    wait_for(lambda: daemon.http("/readyz")[0] == 200, "the daemon ready", timeout=60)

    [minted] = mints(fake, writes_before, role="server")
    assert minted["body"] == {"zoneId": pool.zone_id, "role": "server"}
    [host] = _hosts_of(fake, serving.name)
    assert (host["zoneId"], host["gpuType"], host["gpuCount"]) == (pool.zone_id, "A6000", 4)
    state = daemon.host.thunder()
    assert state["enrollment"]["ip"] == serving.ip
    assert state["enrollment"]["portRange"] == "32000-32199"
    installer = daemon.host.calls("thunder-fake-installer")
    assert installer
    assert installer[0]["env"]["THUNDER_ENROLLMENT_TOKEN"] == "**********"
    metrics = daemon.metrics()
    assert metrics['thunder_dra_daemon_enrollment_state{state="enrolled"}'] == 1
    assert metrics["thunder_dra_daemon_thunderd_healthy"] == 1
    assert metrics["thunder_dra_daemon_serving_node"] == 1
    assert metrics["thunder_dra_daemon_kubelet_registered"] == 1

    # thunderd falls over: restarted with `thunder up`, no new token.
    daemon.host.set_thunder(status="unhealthy")
    wait_for(lambda: daemon.host.thunder()["status"] == "healthy", "thunderd restarted")
    up = [c for c in daemon.host.calls("thunder") if c["argv"][:1] == ["up"]]
    assert up
    assert up[-1]["argv"][1:] == [
        "--ip",
        serving.ip,
        "--zone",
        pool.zone,
        "--node-name",
        serving.name,
    ]
    assert len(mints(fake, writes_before, role="server")) == 1

    # A restart of the daemon finds thunderd healthy: no new enrollment.
    daemon.restart().wait_serving()
    wait_for(lambda: daemon.http("/readyz")[0] == 200, "ready again")
    assert len(mints(fake, writes_before, role="server")) == 1

    # thunderd lost its enrollment: installed again, and the replaced token revoked.
    first_token = json.loads((daemon.state_dir / "node-enrollment.json").read_text())[
        "enrollmentTokenId"
    ]
    daemon.host.set_thunder(installed=False)
    wait_for(lambda: len(mints(fake, writes_before, role="server")) == 2, "a re-enrollment")
    wait_for(lambda: _token_state(fake, first_token) == "revoked", "the old token revoked")
    wait_for(lambda: daemon.http("/readyz")[0] == 200, "ready after re-enrolling")
    assert len(_hosts_of(fake, serving.name)) == 1
    assert fake.admin.leaks() == []


def test_a_failed_install_is_retried_and_never_leaks_a_server_token(
    fake: FakeThunderProcess, serving: NodeHarness
) -> None:
    daemon = serving.daemon
    earlier = {t["enrollmentTokenId"] for t in fake.admin.tokens()}
    writes_before = len(fake.admin.writes())
    # The installer cannot be downloaded: it is fetched before anything is minted, so the
    # failed attempts cost no token at all.
    fake.admin.set_switches(installerStatus=503)
    try:
        daemon.start().wait_serving()
        wait_for(
            lambda: "installer was refused" in daemon.http("/readyz")[1], "the download failure"
        )
        wait_for(
            lambda: (
                daemon.metrics().get(
                    'thunder_dra_daemon_loop_errors_total{loop="node-enrollment"}', 0
                )
                >= 2
            ),
            "retried passes",
        )
        assert mints(fake, writes_before, role="server") == []
    finally:
        fake.admin.set_switches(installerStatus=200)
    # The installer itself fails after the mint: the minted token is revoked, and the
    # daemon tries again.
    daemon.host.set_installer(fail=True)
    try:
        wait_for(lambda: len(mints(fake, writes_before, role="server")) >= 2, "retried enrollments")
        status, body = daemon.http("/readyz")
        assert status == 503
        assert "node not enrolled with Thunder" in body
        assert daemon.metrics()["thunder_dra_daemon_thunderd_healthy"] == 0
        # Every failed attempt revoked its token (the newest may still be in flight).
        server_tokens = sorted(
            (
                t
                for t in fake.admin.tokens()
                if t["role"] == "server" and t["enrollmentTokenId"] not in earlier
            ),
            key=lambda t: str(t["createdAt"]),
        )
        assert len(server_tokens) >= 2
        assert {t["state"] for t in server_tokens[:-1]} == {"revoked"}
    finally:
        daemon.host.set_installer(fail=False)
    wait_for(lambda: daemon.http("/readyz")[0] == 200, "enrolled once the installer is back")
    assert len(_hosts_of(fake, serving.name)) == 1
    assert fake.admin.leaks() == []


def test_a_client_only_node_prepares_claims_without_enrolling(
    kube: Kube, fake: FakeThunderProcess, pool: ZonePool, namespace: str
) -> None:
    writes_before = len(fake.admin.writes())
    with NodeHarness(kube, fake, zone=pool.zone) as node:
        node.daemon.start().wait_serving()
        wait_for(lambda: node.daemon.http("/readyz")[0] == 200, "the client-only daemon ready")
        pods = Workloads(kube, namespace, pool)
        name, _ = pods.create(node)
        pods.wait_running(node, name)
        metrics = node.daemon.metrics()
        assert metrics['thunder_dra_daemon_enrollment_state{state="not-serving"}'] == 1
        pods.delete(name)
        pods.wait_gone(node, name)
    writes = fake.admin.writes()[writes_before:]
    assert mints(fake, writes_before, role="server") == []
    assert not [w for w in writes if w["path"] == "/api/v1/zones/ensure"]
    assert len(mints(fake, writes_before, role="client")) == 1
    assert node.daemon.host.calls() == []
    assert fake.admin.leaks() == []
