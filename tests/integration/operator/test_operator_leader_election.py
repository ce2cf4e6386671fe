"""Two real operator replicas elect a leader through a Lease in the local control plane.

Each test starts two `python -m thunder_dra.controllers` processes (through the test
entry point) with short election timings against one namespace and ThunderCluster.
Exactly one holds the Lease (`kubectl get lease` shows it) and runs inventory passes;
the other never starts one.
Both keep answering `/readyz`, `/healthz` and the validating webhook (an AdmissionReview
posted straight to each replica's TLS port) the whole time. When the leader is
SIGKILLed the standby takes the Lease once it lapses and resumes the passes; when it is
stopped with SIGTERM it releases the Lease and the standby takes it on its next retry.
When another holder overwrites the Lease, the leader stops leading and cancels its
loops at its next renewal, and a replica leads again once that holder's lease lapses.

The takeover times are printed (run with -s), not asserted: the waits are bounded by
the lease timings by construction, with slack for a loaded machine.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from hack.cluster import Cluster, free_port
from hack.fake_thunder import FakeThunderProcess
from hack.testbed.kube import Kube, wait_for
from hack.testbed.operator import (
    RECONCILE_ANNOTATION,
    THUNDER_API,
    OperatorProcess,
    apply_crds,
    thundercluster_manifest,
    token_secret,
)

LEASE = "thunder-device-plugin"
LEASE_DURATION = 4.0
RENEW_DEADLINE = 3.0
RETRY_PERIOD = 0.5
SLACK = 20.0
"""Added to every bound: process start-up and apiserver latency on a loaded machine."""
PASS_STARTS = "thunder_dra_operator_inventory_pass_starts_total"
PASSES = "thunder_dra_operator_inventory_passes_total"
LEADER = "thunder_dra_operator_leader"


@dataclass
class Replica:
    name: str
    process: OperatorProcess
    webhook_port: int
    ca_path: Path

    @property
    def running(self) -> bool:
        return self.process.popen is not None and self.process.popen.poll() is None

    def metric(self, name: str) -> float:
        return self.process.metric(name)

    def probe(self, path: str) -> int:
        url = f"http://127.0.0.1:{self.process.health_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    def review(self, cluster: dict[str, Any]) -> dict[str, Any]:
        """POST an AdmissionReview for `cluster` to this replica's webhook; its response."""
        uid = str(uuid.uuid4())
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {
                    "group": "thundercompute.com",
                    "version": "v1alpha1",
                    "kind": "ThunderCluster",
                },
                "resource": {
                    "group": "thundercompute.com",
                    "version": "v1alpha1",
                    "resource": "thunderclusters",
                },
                "name": cluster["metadata"]["name"],
                "operation": "UPDATE",
                "userInfo": {"username": "leader-election-test"},
                "object": cluster,
                "oldObject": cluster,
                "dryRun": False,
            },
        }
        context = ssl.create_default_context(cafile=str(self.ca_path))
        request = urllib.request.Request(
            f"https://127.0.0.1:{self.webhook_port}/validate-thundercluster",
            data=json.dumps(review).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            answer: dict[str, Any] = json.loads(response.read())
        found: dict[str, Any] = answer["response"]
        assert found["uid"] == uid
        return found


@dataclass
class Prober:
    """Polls probes and the webhook of running replicas in a thread; records failures."""

    replicas: list[Replica]
    cluster: dict[str, Any]
    failures: list[str] = field(default_factory=list)
    rounds: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _excluded: set[str] = field(default_factory=set)

    def exclude(self, replica: Replica) -> None:
        """Stop checking `replica` (it is about to be killed or stopped)."""
        self._excluded.add(replica.name)

    def _once(self) -> None:
        for replica in self.replicas:
            if replica.name in self._excluded:
                continue
            try:
                for path in ("/healthz", "/readyz"):
                    status = replica.probe(path)
                    if status != 200:
                        self.failures.append(f"{replica.name} {path}: HTTP {status}")
                response = replica.review(self.cluster)
                if "allowed" not in response:
                    self.failures.append(f"{replica.name} webhook: {response}")
            except Exception as exc:  # every failure is a finding
                if replica.name not in self._excluded:
                    self.failures.append(f"{replica.name}: {type(exc).__name__}: {exc}")
        self.rounds += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self._once()
            self._stop.wait(0.3)

    def __enter__(self) -> Prober:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(30)


@dataclass
class Pair:
    kube: Kube
    cluster: Cluster
    namespace: str
    name: str
    replicas: list[Replica]

    def kubectl_get_lease(self) -> str:
        """`kubectl get lease -n <namespace>`, as an admin would look for the leader."""
        done = subprocess.run(
            [str(self.cluster.bin_dir / "kubectl"), "get", "lease", "-n", self.namespace],
            env={**os.environ, **self.cluster.env()},
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout

    def lease(self) -> k8s.V1Lease | None:
        api = k8s.CoordinationV1Api(self.kube.api_client)
        try:
            return api.read_namespaced_lease(LEASE, self.namespace)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def holder(self) -> str:
        lease = self.lease()
        if lease is None or lease.spec is None:
            return ""
        return lease.spec.holder_identity or ""

    def replica_holding(self) -> Replica | None:
        holder = self.holder()
        for replica in self.replicas:
            if holder.startswith(f"{replica.name}_"):
                return replica
        return None

    def thundercluster(self) -> dict[str, Any]:
        found = self.kube.get(THUNDER_API, "ThunderCluster", self.name)
        assert found is not None
        return found

    def request_pass(self) -> None:
        api = k8s.CustomObjectsApi(self.kube.api_client)
        api.patch_cluster_custom_object(
            "thundercompute.com",
            "v1alpha1",
            "thunderclusters",
            self.name,
            {"metadata": {"annotations": {RECONCILE_ANNOTATION: uuid.uuid4().hex}}},
        )

    def leader_and_standby(self) -> tuple[Replica, Replica]:
        leader = wait_for(self.replica_holding, "a replica to hold the Lease", timeout=60)
        standby = next(r for r in self.replicas if r is not leader)
        wait_for(lambda: leader.metric(LEADER) == 1, "the leader's gauge", timeout=30)
        wait_for(lambda: leader.metric(PASSES) >= 1, "the leader's first pass", timeout=90)
        return leader, standby


@pytest.fixture
def pair(
    kube: Kube,
    cluster: Cluster,
    fake_thunder: FakeThunderProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Pair]:
    apply_crds(kube)
    name = f"tc-{uuid.uuid4().hex[:6]}"
    with kube.namespace("thunder-le") as namespace:
        kube.create(token_secret(namespace))
        kube.create(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "thunder-dra-daemon", "namespace": namespace},
            }
        )
        kube.create(thundercluster_manifest(name, namespace, fake_thunder.base_url))
        replicas = []
        for label in ("replica-a", "replica-b"):
            port = free_port()
            ca_path = tmp_path / f"{label}-ca.crt"
            args = [
                "--namespace",
                namespace,
                "--cluster-name",
                name,
                "--leader-election-lease-duration",
                f"{LEASE_DURATION:g}s",
                "--leader-election-renew-deadline",
                f"{RENEW_DEADLINE:g}s",
                "--leader-election-retry-period",
                f"{int(RETRY_PERIOD * 1000)}ms",
                "--webhook-port",
                str(port),
                "--webhook-listen",
                "127.0.0.1",
                "--webhook-host",
                "127.0.0.1",
                "--webhook-ca-dump",
                str(ca_path),
            ]
            log_dir = tmp_path / label
            log_dir.mkdir()
            replicas.append(
                Replica(label, OperatorProcess(cluster.kubeconfig, args, log_dir), port, ca_path)
            )
        made = Pair(kube, cluster, namespace, name, replicas)
        try:
            for replica in replicas:
                # The pod name part of the holder identity (the Deployment sets POD_ID).
                monkeypatch.setenv("POD_ID", replica.name)
                replica.process.start()
            yield made
        finally:
            kube.delete(THUNDER_API, "ThunderCluster", name)
            try:
                if any(r.running for r in replicas):
                    wait_for(
                        lambda: kube.get(THUNDER_API, "ThunderCluster", name) is None,
                        "the ThunderCluster to be deleted",
                        timeout=30,
                    )
            finally:
                for replica in replicas:
                    replica.process.stop()
                if kube.get(THUNDER_API, "ThunderCluster", name) is not None:
                    api = k8s.CustomObjectsApi(kube.api_client)
                    api.patch_cluster_custom_object(
                        "thundercompute.com",
                        "v1alpha1",
                        "thunderclusters",
                        name,
                        {"metadata": {"finalizers": None}},
                    )


def test_one_replica_leads_and_the_standby_takes_over_when_it_is_killed(pair: Pair) -> None:
    leader, standby = pair.leader_and_standby()
    lease = pair.lease()
    assert lease is not None
    assert lease.spec is not None
    assert lease.spec.lease_duration_seconds == int(LEASE_DURATION)
    transitions = lease.spec.lease_transitions or 0
    assert standby.metric(LEADER) == 0
    shown = pair.kubectl_get_lease()
    assert "HOLDER" in shown
    assert f"{LEASE} " in shown
    assert f"{leader.name}_" in shown
    assert f"{standby.name}_" not in shown

    with Prober(pair.replicas, pair.thundercluster()) as prober:
        # A change is reconciled by the leader, and only by it.
        before = leader.metric(PASS_STARTS)
        pair.request_pass()
        wait_for(lambda: leader.metric(PASS_STARTS) > before, "the leader's pass", timeout=60)
        assert standby.metric(PASS_STARTS) == 0
        # Both replicas probed while both run (the prober's first round may still be
        # under way when the pass is seen).
        wait_for(lambda: prober.rounds >= 1, "a probe round of both replicas", timeout=SLACK)

        prober.exclude(leader)
        assert leader.process.popen is not None
        leader.process.popen.kill()
        leader.process.popen.wait(30)
        killed = time.monotonic()
        bound = LEASE_DURATION + RETRY_PERIOD * 2.2 + RENEW_DEADLINE
        wait_for(
            lambda: pair.replica_holding() is standby,
            "the standby to take the Lease",
            timeout=bound + SLACK,
        )
        took = time.monotonic() - killed
        wait_for(lambda: standby.metric(LEADER) == 1, "the new leader's gauge", timeout=SLACK)
        # Reconciling resumes on the new leader, on request.
        wait_for(lambda: standby.metric(PASSES) >= 1, "the new leader's first pass", timeout=90)
        before = standby.metric(PASS_STARTS)
        pair.request_pass()
        wait_for(lambda: standby.metric(PASS_STARTS) > before, "a pass after the request")
        rounds = prober.rounds
        wait_for(lambda: prober.rounds > rounds + 1, "more probe rounds", timeout=SLACK)
    assert prober.failures == []
    lease = pair.lease()
    assert lease is not None
    assert lease.spec is not None
    assert (lease.spec.lease_transitions or 0) == transitions + 1
    print(f"\ntakeover after SIGKILL: {took:.2f}s (lease {LEASE_DURATION:g}s)")


def test_a_graceful_stop_releases_the_lease_and_the_standby_takes_it_at_once(
    pair: Pair,
) -> None:
    leader, standby = pair.leader_and_standby()
    with Prober(pair.replicas, pair.thundercluster()) as prober:
        prober.exclude(leader)
        stopping = time.monotonic()
        assert leader.process.stop() == 0
        stopped = time.monotonic()
        # Released (holder emptied) or already taken by the standby on its next retry.
        holder = pair.holder()
        assert holder == "" or holder.startswith(f"{standby.name}_"), holder
        assert "released the Lease" in leader.process.log_text()
        # The standby does not wait for the lease to lapse: one retry with jitter.
        wait_for(
            lambda: pair.replica_holding() is standby,
            "the standby to take the released Lease",
            timeout=RETRY_PERIOD * 2.2 + SLACK,
        )
        took = time.monotonic() - stopped
        wait_for(lambda: standby.metric(PASSES) >= 1, "the new leader's first pass", timeout=90)
        rounds = prober.rounds
        wait_for(lambda: prober.rounds > rounds + 1, "more probe rounds", timeout=SLACK)
    assert prober.failures == []
    print(
        f"\nSIGTERM to exit: {stopped - stopping:.2f}s; "
        f"takeover after exit: {took:.2f}s (retry period {RETRY_PERIOD:g}s)"
    )


def test_a_leader_whose_lease_is_taken_stops_reconciling_at_once(pair: Pair) -> None:
    leader, standby = pair.leader_and_standby()
    api = k8s.CoordinationV1Api(pair.kube.api_client)

    def take() -> bool:
        lease = api.read_namespaced_lease(LEASE, pair.namespace)
        assert lease.spec is not None
        lease.spec.holder_identity = "intruder"
        lease.spec.renew_time = datetime.now(UTC)
        try:
            api.replace_namespaced_lease(LEASE, pair.namespace, lease)
        except k8s.ApiException as exc:
            if exc.status == 409:  # the leader renewed in between: read again
                return False
            raise
        return True

    with Prober(pair.replicas, pair.thundercluster()) as prober:
        wait_for(take, "the Lease overwritten by another holder", timeout=SLACK)
        # At the leader's next renewal (a retry period) it sees the other holder.
        wait_for(
            lambda: leader.metric(LEADER) == 0,
            "the leader to stop leading",
            timeout=RETRY_PERIOD + SLACK,
        )
        records = leader.process.log_records()
        stopped = [r for r in records if r.get("message") == "stopped leading"]
        assert stopped
        assert "intruder" in str(stopped[-1])
        wait_for(
            lambda: any(
                r.get("message") == "stopped reconciling ThunderCluster"
                for r in leader.process.log_records()
            ),
            "the leader's loops to stop",
            timeout=SLACK,
        )
        assert standby.metric(LEADER) == 0
        # The intruder never renews: once its lease lapses a replica leads again.
        wait_for(
            lambda: pair.replica_holding() is not None,
            "a replica to take the lapsed Lease",
            timeout=LEASE_DURATION + RETRY_PERIOD * 2.2 + SLACK,
        )
        again = pair.replica_holding()
        assert again is not None
        wait_for(lambda: again.metric(LEADER) == 1, "the new term's gauge", timeout=SLACK)
    assert prober.failures == []
