"""The launcher's opt-in scheduler options: a KubeSchedulerConfiguration and another binary.

By default the scheduler runs without a config file. With `scheduler_config` it reads
the given settings (here a second profile, which only a config file can declare, so a
pod naming it is scheduled only if the file was read) and still reaches the API server
(the launcher fills in clientConnection, which a config file must carry). With
`scheduler_binary` that binary is the one started.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from hack.cluster import Cluster, ClusterConfig
from hack.testbed.kube import Kube, wait_for


def _argv(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def _pod(name: str, scheduler_name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler_name,
            "containers": [{"name": "main", "image": "registry.invalid/none:1"}],
            "automountServiceAccountToken": False,
        },
    }


def test_default_scheduler_has_no_config_file(cluster: Cluster) -> None:
    argv = _argv(cluster.pids["kube-scheduler"])
    assert not [a for a in argv if a.startswith("--config")], argv
    assert argv[0] == str(cluster.bin_dir / "kube-scheduler")


def test_scheduler_config_and_binary_are_used(tmp_path: Path, cluster: Cluster) -> None:
    binary = tmp_path / "bin" / "kube-scheduler"
    binary.parent.mkdir()
    binary.symlink_to(cluster.bin_dir / "kube-scheduler")
    config = ClusterConfig(
        audit=False,
        scheduler_config={
            "percentageOfNodesToScore": 37,
            "profiles": [{"schedulerName": "default-scheduler"}, {"schedulerName": "second"}],
        },
        scheduler_binary=binary,
    )
    with Cluster(workdir=tmp_path / "cp", config=config, bin_dir=cluster.bin_dir) as c:
        argv = _argv(c.pids["kube-scheduler"])
        assert argv[0] == str(binary)
        assert f"--config={c.workdir / 'scheduler-config.yaml'}" in argv
        kube = Kube(c.kubeconfig)
        with kube.nodes({"n1": {"zone": "z"}}), kube.namespace("sched") as ns:
            kube.create_pod(ns, _pod("by-second", "second"))

            def node_of_pod() -> str | None:
                spec = kube.core.read_namespaced_pod("by-second", ns).spec
                return spec.node_name if spec else None

            bound = wait_for(
                node_of_pod,
                "the pod of the config file's second profile to be bound",
                timeout=60,
            )
            assert bound == "n1"


def test_config_file_carries_the_connection_and_no_leader_election(tmp_path: Path) -> None:
    config = ClusterConfig(scheduler_config={"percentageOfNodesToScore": 5})
    launcher = Cluster(workdir=tmp_path, config=config, bin_dir=tmp_path)
    flags = launcher._scheduler_config_flags(tmp_path / "scheduler.kubeconfig")
    assert flags == [f"--config={tmp_path / 'scheduler-config.yaml'}"]
    written = yaml.safe_load((tmp_path / "scheduler-config.yaml").read_text())
    assert written == {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "percentageOfNodesToScore": 5,
        "clientConnection": {"kubeconfig": str(tmp_path / "scheduler.kubeconfig")},
        "leaderElection": {"leaderElect": False},
    }
