"""The kubelet-calls benchmark's Go programs (hack/tools/kubeletbench) build from the pinned
modules and work together on the local control plane: drabench, the kubelet's own DRA
manager, registers floorplugin from a plugins_registry directory and prepares and
unprepares pods' claims through it, several in flight, reporting every call, the CPU of the
processes it was given and the kubelet's gRPC metric for the same calls."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.kubelet_calls import Floor, build
from bench.kubelet_report import parse_case
from hack.cluster import Cluster
from hack.testbed.kube import Kube, wait_for

DRIVER = "thundercompute.com"
CLAIMS = 5


@pytest.fixture(scope="module")
def programs() -> Path:
    return build()


def _reserved_claim(kube: Kube, namespace: str, index: int) -> dict[str, str]:
    """A claim allocated to the driver and reserved for a bare pod, as the scheduler leaves it."""
    pod: Any = {
        "metadata": {"name": f"pod-{index}"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    created_pod: Any = kube.core.create_namespaced_pod(namespace, pod)
    claim = kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"claim-{index}", "namespace": namespace},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}
            },
        }
    )
    claims = kube.resource("resource.k8s.io/v1", "ResourceClaim")
    status = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": "p", "device": f"d{index}"}
                    ]
                }
            },
            "reservedFor": [
                {"resource": "pods", "name": f"pod-{index}", "uid": created_pod.metadata.uid}
            ],
        }
    }
    claims.status.patch(
        body=status,
        name=f"claim-{index}",
        namespace=namespace,
        content_type="application/merge-patch+json",
    )
    return {
        "namespace": namespace,
        "claim": claim["metadata"]["name"],
        "pod": f"pod-{index}",
        "pod_uid": created_pod.metadata.uid,
    }


def _drabench(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def _drabench_command(
    programs: Path,
    cluster: Cluster,
    node: str,
    floor: Floor,
    state: Path,
    pods: Path,
    *extra: str,
) -> list[str]:
    """drabench's command line against the floor plugin, with ``extra`` flags (the
    tests that check several pods in flight give ``--in-flight 2``)."""
    return [
        str(programs / "drabench"),
        "--kubeconfig", str(cluster.kubeconfig),
        "--node", node,
        "--registry-dir", str(floor.registry),
        "--state-dir", str(state),
        "--claims", str(pods),
        *extra,
    ]  # fmt: skip


@pytest.fixture
def workdir() -> Iterator[Path]:
    # Unix socket paths are short: not under pytest's deep tmp_path.
    with tempfile.TemporaryDirectory(prefix="kb") as path:
        yield Path(path)


def test_drabench_prepares_and_unprepares_through_the_floor_plugin(
    programs: Path, cluster: Cluster, kube: Kube, workdir: Path
) -> None:
    # drabench, as a kubelet does, deletes its node's ResourceSlices at start: a node name
    # no other test uses (and no Node object: the manager then only retries in the background).
    node = f"kubeletbench-{uuid.uuid4().hex[:8]}"
    with kube.namespace("kubeletbench") as namespace:
        pods = [_reserved_claim(kube, namespace, i) for i in range(CLAIMS)]
        pods_file = workdir / "pods.json"
        pods_file.write_text(json.dumps(pods))
        floor = Floor(programs / "floorplugin", workdir / "floor", cluster.kubeconfig, node)
        try:
            state = workdir / "kubelet"
            state.mkdir()
            done = _drabench(_drabench_command(
                programs, cluster, node, floor, state, pods_file,
                "--in-flight", "2",
                "--cpu", f"plugin={floor.process.pid}",
                "--cpu", f"kube-apiserver={cluster.pids['kube-apiserver']}",
            ))  # fmt: skip
        finally:
            floor.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    raw = json.loads(done.stdout)
    assert raw["in_flight"] == 2
    assert len(raw["prepare_s"]) == len(raw["unprepare_s"]) == CLAIMS
    assert all(0 < s < 30 for s in raw["prepare_s"] + raw["unprepare_s"])
    # The kubelet's own metric saw exactly the timed calls (the warm-up is outside it).
    assert raw["grpc"]["NodePrepareResources"]["count"] == CLAIMS
    assert raw["grpc"]["NodeUnprepareResources"]["count"] == CLAIMS
    assert set(raw["cpu_ticks"]) == {"plugin", "kube-apiserver", "drabench"}
    case = parse_case("floor", raw, os.sysconf("SC_CLK_TCK"))
    assert case.calls == CLAIMS
    assert case.claims_per_second > 0
    # Every claim was unprepared: the manager's checkpoint holds no claim.
    checkpoint = json.loads((state / "dra_manager_state").read_text())
    assert "claim-" not in json.dumps(checkpoint)


def test_drabench_ends_reservations_between_the_calls_and_warms_up_on_its_own_pods(
    programs: Path, cluster: Cluster, kube: Kube, workdir: Path
) -> None:
    node = f"kubeletbench-{uuid.uuid4().hex[:8]}"
    with kube.namespace("kubeletbench-ends") as namespace:
        timed = [_reserved_claim(kube, namespace, i) for i in range(CLAIMS)]
        warmup = [_reserved_claim(kube, namespace, CLAIMS + i) for i in range(2)]
        (workdir / "pods.json").write_text(json.dumps(timed))
        (workdir / "warmup.json").write_text(json.dumps(warmup))
        floor = Floor(programs / "floorplugin", workdir / "floor", cluster.kubeconfig, node)
        try:
            state = workdir / "kubelet"
            state.mkdir()
            done = _drabench(_drabench_command(
                programs, cluster, node, floor, state, workdir / "pods.json",
                "--in-flight", "2",
                "--warmup-claims", str(workdir / "warmup.json"),
                "--end-reservations",
            ))  # fmt: skip
        finally:
            floor.stop()
        assert done.returncode == 0, done.stderr[-3000:]
        raw = json.loads(done.stdout)
        # The warm-up took its own pods: every pod of --claims was timed.
        assert len(raw["prepare_s"]) == len(raw["unprepare_s"]) == CLAIMS
        assert raw["grpc"]["NodePrepareResources"]["count"] == CLAIMS
        claims = kube.resource("resource.k8s.io/v1", "ResourceClaim")
        for pod in timed + warmup:
            found = claims.get(name=pod["claim"], namespace=namespace).to_dict()
            assert not (found.get("status") or {}).get("reservedFor"), pod["claim"]
            assert (found.get("status") or {}).get("allocation"), pod["claim"]


def test_drabench_lets_each_pod_run_between_its_calls_outside_both_timings(
    programs: Path, cluster: Cluster, kube: Kube, workdir: Path
) -> None:
    node = f"kubeletbench-{uuid.uuid4().hex[:8]}"
    run_for = 8.0
    with kube.namespace("kubeletbench-runs") as namespace:
        timed = [_reserved_claim(kube, namespace, 0)]
        warmup = [_reserved_claim(kube, namespace, 1)]
        (workdir / "pods.json").write_text(json.dumps(timed))
        (workdir / "warmup.json").write_text(json.dumps(warmup))
        floor = Floor(programs / "floorplugin", workdir / "floor", cluster.kubeconfig, node)
        state = workdir / "kubelet"
        state.mkdir()
        checkpoint = state / "dra_manager_state"
        command = _drabench_command(
            programs, cluster, node, floor, state, workdir / "pods.json",
            "--warmup", "1",
            "--warmup-claims", str(workdir / "warmup.json"),
            "--run-for", f"{run_for:g}s",
        )  # fmt: skip
        try:
            proc = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            try:
                # The timed pod is running: its claim is prepared in the kubelet's
                # checkpoint, and drabench is still waiting to unprepare it.
                wait_for(
                    lambda: checkpoint.exists() and timed[0]["claim"] in checkpoint.read_text(),
                    "the timed pod's claim prepared while it runs",
                    timeout=120,
                    interval=0.1,
                )
                assert proc.poll() is None
                out, err = proc.communicate(timeout=300)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        finally:
            floor.stop()
        assert proc.returncode == 0, err[-3000:]
        raw = json.loads(out)
        assert len(raw["prepare_s"]) == len(raw["unprepare_s"]) == 1
        # The pod's running time is in neither call's timing.
        assert raw["prepare_s"][0] + raw["unprepare_s"][0] < run_for
        assert timed[0]["claim"] not in checkpoint.read_text()
