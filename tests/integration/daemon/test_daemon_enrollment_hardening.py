"""Node enrollment through the real daemon on a simulated serving node: no token in any
process's argv and no sudo during the install, one install at a time when two daemon
instances share the node, and a thunderd watch that outlives a paused kube-apiserver."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hack.cluster import Cluster
from hack.fake_thunder import FakeThunderProcess
from hack.testbed.daemon import DaemonProcess, NodeHarness, ZonePool, mints
from hack.testbed.kube import Kube, wait_for
from thunder_dra.version import user_agent

GPUS = ["NVIDIA RTX A6000"] * 4
MINT = "/api/v1/enrollment-tokens"
LOOP_ERRORS = 'thunder_dra_daemon_loop_errors_total{loop="node-enrollment"}'


class ArgvWatcher:
    """Polls every process's ``/proc/<pid>/cmdline`` in a thread and keeps each one seen,
    as any user on the host could read them."""

    def __init__(self, interval: float = 0.005) -> None:
        self.seen: set[tuple[str, ...]] = set()
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                try:
                    with open(f"/proc/{entry.name}/cmdline", "rb") as handle:
                        raw = handle.read()
                except OSError:
                    continue
                if raw:
                    parts = raw.split(b"\0")[:-1] if raw.endswith(b"\0") else raw.split(b"\0")
                    self.seen.add(tuple(p.decode(errors="replace") for p in parts))
            time.sleep(self._interval)

    def __enter__(self) -> ArgvWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def _server_tokens(fake: FakeThunderProcess, zone_id: str) -> list[dict[str, Any]]:
    state = fake.admin.state()
    return [
        t for t in state["enrollmentTokens"] if t["role"] == "server" and t["zoneId"] == zone_id
    ]


def _hosts_of(fake: FakeThunderProcess, node: str) -> list[dict[str, Any]]:
    return [h for h in fake.admin.state()["hosts"] if h["hostname"] == node]


def _recorded_token(daemon: DaemonProcess) -> str:
    return str(
        json.loads((daemon.state_dir / "node-enrollment.json").read_text())["enrollmentTokenId"]
    )


def _ready(daemon: DaemonProcess) -> bool:
    if not daemon.running():
        raise AssertionError(f"daemon exited:\n{daemon.log_text()[-4000:]}")
    return daemon.http("/readyz")[0] == 200


def _assert_one_enrollment(fake: FakeThunderProcess, node: NodeHarness, zone_id: str) -> None:
    """One host for the node, registered with the recorded token; every other server token
    of the node's zone minted here is revoked; the fake's audit finds no leak."""
    [host] = _hosts_of(fake, node.name)
    recorded = _recorded_token(node.daemon)
    assert host["enrollmentTokenId"] == recorded
    assert node.daemon.host.thunder()["enrollment"]["enrollmentTokenId"] == recorded
    for token in _server_tokens(fake, zone_id):
        if token["enrollmentTokenId"] != recorded:
            assert token["revokedAt"] is not None, token["enrollmentTokenId"]
    assert fake.admin.leaks() == []


@pytest.fixture
def serving_pool(kube: Kube, crds: None, fake: FakeThunderProcess) -> Iterator[ZonePool]:
    # A zone of its own per test, so server tokens and hosts are the test's alone.
    published = ZonePool(kube, fake).publish()
    try:
        yield published
    finally:
        published.withdraw()


@pytest.fixture(autouse=True)
def no_faults_left(fake: FakeThunderProcess) -> Iterator[None]:
    yield
    fake.admin.clear_faults()


@pytest.mark.timeout(240)
def test_the_host_install_puts_no_token_in_any_argv_and_uses_no_sudo(
    kube: Kube, fake: FakeThunderProcess, serving_pool: ZonePool
) -> None:
    downloads_before = len(fake.admin.downloads())
    with NodeHarness(kube, fake, zone=serving_pool.zone, serving=True) as node:
        host = node.daemon.host
        host.set_nvidia(gpus=GPUS)
        host.set_installer(delay_seconds=2)  # long enough for the watcher to see it run
        with ArgvWatcher() as watcher:
            node.daemon.start().wait_serving()
            wait_for(lambda: _ready(node.daemon), "the node enrolled", timeout=120)

        secrets = [t["enrollmentToken"] for t in _server_tokens(fake, serving_pool.zone_id)]
        assert secrets
        # The watcher saw the install, and no process it saw held a token in its argv.
        assert any(any("thunder-fake-installer" in w for w in argv) for argv in watcher.seen)
        holding = [argv for argv in watcher.seen if any(s in " ".join(argv) for s in secrets)]
        assert holding == []
        # Nor did any ancestor of the installer (the fake sudo waits for its command, as
        # sudo does, so a `sudo VAR=value` would still be in the chain); sudo never ran.
        starts = [e for e in host.installs() if e["event"] == "start"]
        assert starts
        assert [e["tokenInArgv"] for e in starts] == [False] * len(starts)
        assert host.calls("sudo") == []
        # The token reached the installer through its environment.
        [installer] = host.calls("thunder-fake-installer")
        assert installer["env"]["THUNDER_ENROLLMENT_TOKEN"] == "**********"
        # The installer that ran is the text the daemon fetched: nobody else downloaded it.
        scripts = [
            d for d in fake.admin.downloads()[downloads_before:] if d["path"].endswith("install.sh")
        ]
        assert scripts
        assert {d["userAgent"] for d in scripts} == {user_agent("daemon")}
        # No token in the daemon's own log either.
        log_text = node.daemon.log_text()
        assert not [s for s in secrets if s in log_text]
        _assert_one_enrollment(fake, node, serving_pool.zone_id)


@pytest.mark.timeout(300)
def test_two_instances_on_one_node_never_install_at_once_nor_orphan_a_server_token(
    kube: Kube, fake: FakeThunderProcess, serving_pool: ZonePool
) -> None:
    writes_before = len(fake.admin.writes())
    with NodeHarness(kube, fake, zone=serving_pool.zone, serving=True) as node:
        host = node.daemon.host
        host.set_nvidia(gpus=GPUS)
        host.set_installer(delay_seconds=3)
        old = node.daemon
        new = node.another_instance(fake, "b")
        # A rolling update on a fresh node: both instances find thunderd not installed.
        old.start()
        new.start()
        try:
            for daemon in (old, new):
                daemon.wait_serving(timeout=90)
            wait_for(lambda: _ready(old) and _ready(new), "both instances ready", timeout=150)
            starts = [e for e in host.installs() if e["event"] == "start"]
            assert [e["concurrent"] for e in starts] == [False] * len(starts)
            assert len(starts) == 1
            assert len(mints(fake, writes_before, role="server")) == 1
            _assert_one_enrollment(fake, node, serving_pool.zone_id)

            # thunderd loses its enrollment while both run: one of them reinstalls, once,
            # and the replaced enrollment is revoked.
            first = _recorded_token(old)
            host.set_thunder(installed=False)
            wait_for(
                lambda: host.thunder().get("installed") and _ready(old) and _ready(new),
                "re-enrolled",
                timeout=150,
            )
            wait_for(lambda: _recorded_token(old) != first, "the new enrollment recorded")
            wait_for(lambda: fake.admin.token(first)["state"] == "revoked", "the old token revoked")
            starts = [e for e in host.installs() if e["event"] == "start"]
            assert [e["concurrent"] for e in starts] == [False] * len(starts)
            assert len(starts) == 2
            assert len(mints(fake, writes_before, role="server")) == 2
            _assert_one_enrollment(fake, node, serving_pool.zone_id)
        finally:
            new.stop()


def _metric(daemon: DaemonProcess, name: str) -> float:
    return daemon.metrics().get(name, 0.0)


@pytest.mark.timeout(300)
def test_the_thunderd_watch_outlives_a_paused_apiserver_and_failing_thunder(
    cluster: Cluster, kube: Kube, fake: FakeThunderProcess, serving_pool: ZonePool
) -> None:
    with NodeHarness(kube, fake, zone=serving_pool.zone, serving=True) as node:
        daemon = node.daemon
        host = daemon.host
        host.set_nvidia(gpus=GPUS)
        daemon.start().wait_serving()
        wait_for(lambda: _ready(daemon), "the node enrolled", timeout=120)
        errors_before = _metric(daemon, LOOP_ERRORS)

        apiserver = cluster.pids["kube-apiserver"]
        os.kill(apiserver, signal.SIGSTOP)
        try:
            # Thunder fails as well: thunderd lost its enrollment and every mint answers
            # 503, so each pass of the watch fails and is retried.
            fake.admin.add_fault(MINT, method="POST", status=503)
            host.set_thunder(installed=False)
            wait_for(
                lambda: _metric(daemon, LOOP_ERRORS) >= errors_before + 2,
                "failed passes counted",
                timeout=90,
            )
            # Longer than a Kubernetes request timeout (20 s) of the daemon's client.
            time.sleep(25)
            assert daemon.running()
        finally:
            os.kill(apiserver, signal.SIGCONT)
        fake.admin.clear_faults()
        wait_for(lambda: _ready(daemon), "enrolled again once Thunder answers", timeout=120)

        # The watch still does its job: thunderd stops and is restarted.
        host.set_thunder(status="unhealthy")
        wait_for(lambda: host.thunder()["status"] == "healthy", "thunderd restarted", timeout=60)
        up = [c for c in host.calls("thunder") if c["argv"][:1] == ["up"]]
        assert up
        _assert_one_enrollment(fake, node, serving_pool.zone_id)
        records = daemon.log_records()
        assert any(r.get("message") == "node enrollment failed; retrying" for r in records)


def test_watcher_reads_real_process_lists(tmp_path: Path) -> None:
    # The watcher would miss nothing it is meant to catch: it sees a short-lived process.
    marker = f"argv-watcher-marker-{os.getpid()}"
    with ArgvWatcher() as watcher:
        os.system(f"sh -c 'sleep 0.3; : {marker}'")
    assert any(marker in " ".join(argv) for argv in watcher.seen)
