"""The README's install on a real node: the chart's own images as pods on a kubelet.

The Install section runs as written (namespace, token Secret, CRDs with `kubectl apply
--server-side`, `helm install`), with the images `make image` built (imported into the
node's containerd, `pullPolicy: Never`) and the fake Thunder as the API. The fake
listens on the node's bridge address over https, with a certificate from the cluster
CA: the driver refuses plain http to anything but loopback, and the operator and daemon
pods trust that CA through their service-account `ca.crt` (`SSL_CERT_FILE` in
`extraEnv`, no other chart change).

The node runs containerd and the kubelet in a private PID and mount namespace
(``hack.node``), so the daemon pod's `nsenter --target 1` enters it: there the fake host
tools (hack/fake_host) stand in for thunderd's installer, `thunder` and `nvidia-smi`, and
`/run/cdi`, `/var/lib/thunder-dra` and `/var/lib/kubelet` are the node's own.

Then, in order (the tests share one install): the operator Deployment is Ready and its
webhook answers the apiserver; the daemon pod runs, registers with the kubelet and
enrolls the serving node; `helm test` passes as a real Pod; a stock Debian pod asking
`resources.limits: thundercompute.com/gpu-a6000: 2` runs with the files containerd
injected from the daemon's CDI spec and no token in its environment; a
ResourceClaimTemplate pod the same; the `pod` test chart installs and its pod runs;
deleting the pods unprepares them and the fake's audit shows no leaked enrollment; and
`helm uninstall` alone, its pre-delete hook running as a Job on the node, removes the
release and its ThunderCluster.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from hack import image as image_builder
from hack.fake_host import FakeHost
from hack.node.chart import (
    INJECTED,
    NAMESPACE,
    POD_CHART,
    RELEASE,
    Install,
    installed,
    wait,
)
from hack.node.chart import check_injected as _check_injected
from hack.node.chart import running as _running
from hack.node.launcher import Node
from tests.e2e.node.conftest import pod_logs, run_pod, stock_pod

DRIVER = "thundercompute.com"


@pytest.fixture(scope="module")
def install(
    real_node: Node,
    node_images: dict[str, image_builder.BuiltImage],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Install]:
    with installed(real_node, node_images, tmp_path_factory.mktemp("node-install")) as done:
        yield done


def test_helm_install_brings_the_operator_deployment_to_ready(install: Install) -> None:
    assert "STATUS: deployed" in install.install_output, install.install_output
    deployments = install.get("deployments", "-n", NAMESPACE)["items"]
    assert len(deployments) == 1
    status = deployments[0]["status"]
    assert status.get("readyReplicas") == 1, status
    image = deployments[0]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == install.images["operator"].ref


def test_the_operator_pods_webhook_answers_the_apiserver(install: Install) -> None:
    other = install.workdir / "second-thundercluster.yaml"
    other.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "thundercompute.com/v1alpha1",
                "kind": "ThunderCluster",
                "metadata": {"name": "by-hand"},
                # Valid for the CRD's schema; only the webhook knows label keys.
                "spec": {"daemon": {"nodeSelector": {"not a label key": "x"}}},
            }
        )
    )
    done = subprocess.run(
        [str(install.node.cluster.bin_dir / "kubectl"),
         f"--kubeconfig={install.node.cluster.kubeconfig}", "create", "-f", str(other)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert 'admission webhook "thunderclusters.thundercompute.com" denied the request' in (
        done.stderr
    ), done.stderr
    assert "spec.daemon.nodeSelector" in done.stderr


def test_the_daemon_pod_registers_with_the_kubelet_and_enrolls_the_node(install: Install) -> None:
    pod = wait(install.ready_daemon_pod, "a Ready daemon pod", timeout=240)
    assert pod["spec"]["nodeName"] == install.node.config.name
    assert pod["spec"]["containers"][0]["image"] == install.images["daemon"].ref

    # The real kubelet took the plugin's registration socket and dialled its DRA socket.
    def registered() -> str | None:
        lines = install.node.logs("kubelet").splitlines()
        # pluginmanager's reconciler (V1), then the DRA plugin manager (V2) once connected.
        started = any("RegisterPlugin started" in ln and DRIVER in ln for ln in lines)
        connected = (
            ln
            for ln in lines
            if "Connection changed" in ln
            and f'driverName="{DRIVER}"' in ln
            and "connected=true" in ln
        )
        return next(connected, None) if started else None

    assert DRIVER in wait(registered, "the kubelet to register the plugin")

    # Enrolled through nsenter into the node's namespaces, where the fake host tools are.
    enrolled = wait(install.enrolled_host, "the serving node registered with Thunder", 240)
    assert (enrolled["gpuType"], enrolled["gpuCount"]) == ("A6000", 4)
    installs = FakeHost(install.node.fake_host_dir).installs()
    starts = [e for e in installs if e["event"] == "start"]
    assert starts, installs
    assert not any(e["tokenInArgv"] for e in starts)
    assert any(e["event"] == "end" and e["exitCode"] == 0 for e in installs)


def test_helm_test_passes_as_a_pod_on_the_node(install: Install) -> None:
    zone = wait(install.zone_id, "the node's zone in Thunder")
    install.fake.admin.set_targets(zone, {"A6000": 1.5})
    wait(lambda: install.get("deviceclass", "thunder-gpu-a6000"), "DeviceClass thunder-gpu-a6000")
    # (Not --logs: helm then also asks for logs of the hooks that are not Pods.)
    out = install.helm("test", RELEASE, "-n", NAMESPACE, "--timeout", "3m")
    assert "Phase:          Succeeded" in out, out
    assert "Failed" not in out, out
    logs = pod_logs(install.node, f"{RELEASE}-test", NAMESPACE)
    assert "thunder-gpu-a6000\tthundercompute.com/gpu-a6000" in logs, logs


def _stock(install: Install, name: str, **spec: Any) -> dict[str, Any]:
    return stock_pod(name, install.images["stock"].ref, INJECTED, **spec)


def test_a_stock_pod_with_extended_resource_limits_gets_the_injected_files(
    install: Install,
) -> None:
    wait(lambda: install.get("deviceclass", "thunder-gpu-a6000"), "DeviceClass thunder-gpu-a6000")
    limits = {"thundercompute.com/gpu-a6000": "2"}
    pod = run_pod(
        install.node,
        _stock(install, "limits", container={"resources": {"limits": limits}}),
        timeout=240,
    )
    logs = pod_logs(install.node, "limits")
    assert pod["status"]["phase"] == "Succeeded", logs
    _check_injected(install, logs)
    install.node.kubectl("delete", "pod", "limits", "--wait=true")
    install.wait_claims_gone("default")


def test_a_resourceclaimtemplate_pod_gets_the_injected_files(install: Install) -> None:
    template = install.workdir / "template.yaml"
    template.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": "two-a6000", "namespace": "default"},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {
                                    "name": "gpu",
                                    "exactly": {
                                        "deviceClassName": "thunder-gpu-a6000",
                                        "allocationMode": "ExactCount",
                                        "count": 2,
                                    },
                                }
                            ]
                        }
                    }
                },
            }
        )
    )
    install.node.kubectl("apply", "-f", str(template))
    manifest = _stock(
        install,
        "claimed",
        container={"resources": {"claims": [{"name": "gpu", "request": "gpu"}]}},
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "two-a6000"}],
    )
    pod = run_pod(install.node, manifest, timeout=240)
    logs = pod_logs(install.node, "claimed")
    assert pod["status"]["phase"] == "Succeeded", logs
    _check_injected(install, logs)
    install.node.kubectl("delete", "pod", "claimed", "--wait=true")
    install.wait_claims_gone("default")


def test_the_pod_test_chart_installs_and_its_pod_runs(install: Install) -> None:
    install.node.kubectl("create", "namespace", "chart-pod")
    command = ["/bin/sh", "-c", INJECTED]
    values = install.workdir / "pod-values.yaml"
    values.write_text(
        yaml.safe_dump(
            {"image": install.images["stock"].ref, "command": command, "gpu": {"count": 2}}
        )
    )
    out = install.helm("install", "gpu", str(POD_CHART), "-n", "chart-pod", "-f", str(values))
    assert "STATUS: deployed" in out

    def finished() -> str | None:
        pod = install.get("pod", "-n", "chart-pod", "gpu-gpu") or {}
        phase = (pod.get("status") or {}).get("phase")
        return str(phase) if phase in ("Succeeded", "Failed") else None

    assert wait(finished, "the pod chart's pod to finish", timeout=240) == "Succeeded"
    _check_injected(install, pod_logs(install.node, "gpu-gpu", "chart-pod"))
    install.helm("uninstall", "gpu", "-n", "chart-pod", "--wait")
    install.wait_claims_gone("chart-pod")


def test_after_a_runtime_restart_with_empty_cdi_dirs_claims_get_their_specs_back(
    install: Install,
) -> None:
    """A reboot of the node's runtime: kubelet and containerd stopped (every container
    dies), the CDI directory emptied, both started again. The restarted daemon writes
    the running claim's spec back, its pod runs again and a new pod starts."""
    limits = {"thundercompute.com/gpu-a6000": "2"}
    survivor = _stock(install, "survivor", container={"resources": {"limits": limits}})
    survivor["spec"]["restartPolicy"] = "Always"
    survivor["spec"]["containers"][0]["command"] = ["/bin/sh", "-c", INJECTED + "sleep 3600"]
    path = install.workdir / "survivor.yaml"
    path.write_text(yaml.safe_dump(survivor))
    install.node.kubectl("apply", "-f", str(path))
    wait(lambda: _running(install, "survivor"), "the survivor pod running", timeout=240)
    before = {p.name for p in install.cdi_specs()}
    assert len(before) == 1, before

    def empty_cdi() -> None:
        for spec in install.cdi_specs():
            spec.unlink()
        assert not install.cdi_specs()

    install.node.restart_runtime(between=empty_cdi)
    wait(lambda: before <= {p.name for p in install.cdi_specs()}, "the claim's CDI spec back", 240)
    wait(install.ready_daemon_pod, "the daemon pod Ready again", timeout=240)

    def restarted() -> dict[str, Any] | None:
        pod = _running(install, "survivor")
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
        return pod if statuses[0].get("restartCount", 0) >= 1 else None

    wait(restarted, "the survivor's container running again", timeout=300)
    _check_injected(install, pod_logs(install.node, "survivor"))
    pod = run_pod(
        install.node,
        _stock(install, "after-restart", container={"resources": {"limits": limits}}),
        timeout=240,
    )
    logs = pod_logs(install.node, "after-restart")
    assert pod["status"]["phase"] == "Succeeded", logs
    _check_injected(install, logs)
    install.node.kubectl("delete", "pod", "survivor", "after-restart", "--wait=true")
    install.wait_claims_gone("default")


def test_after_the_pods_are_gone_no_enrollment_leaked(install: Install) -> None:
    for namespace in ("default", "chart-pod"):
        install.wait_claims_gone(namespace)
    wait(lambda: not install.cdi_specs(), "the claims' CDI specs removed")
    assert install.fake.admin.leaks() == []


def test_helm_uninstall_alone_removes_the_release_and_its_thundercluster(install: Install) -> None:
    # As README's Uninstall has it: one command. The chart's pre-delete hook, a Job in the
    # operator's image, deletes the ThunderCluster while the operator still runs, which
    # releases its finalizer; nobody removes a finalizer by hand.
    clusters = install.get("thunderclusters")
    assert clusters is not None
    assert clusters["items"], "the chart made a ThunderCluster"
    out = install.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "5m")
    assert f'release "{RELEASE}" uninstalled' in out, out
    assert install.get("thunderclusters")["items"] == []
    assert install.get("jobs", "-n", NAMESPACE)["items"] == [], "the hook's Job is gone"
    assert install.get("deployments", "-n", NAMESPACE)["items"] == []
    assert install.fake.admin.leaks() == []
