"""`make demo`: the whole driver on a throwaway local control plane, end to end.

    python -m hack.demo

Starts etcd, kube-apiserver, kube-scheduler and kube-controller-manager, a fake
Thunder service, the operator (a real `python -m thunder_dra.controllers`
process) and, on three simulated nodes in two zones, one real daemon
(`python -m thunder_dra.plugin`) each beside a kubelet stand-in. The serving
node's daemon enrolls it with Thunder (its fake GPUs are 4 A6000), the operator
publishes the zone pool at Thunder's oversubscription target 1.5, and two pods,
one with a ResourceClaimTemplate and one with `resources.limits`, are
scheduled, prepared and cleaned up. Everything it starts is stopped on exit.

As root, with the node components built (``make node-tools``; ``make demo`` builds
them and the images), it runs on a real node instead (``hack.node``): the README's
install of the chart with the images ``make image`` built, the daemon pod enrolling the
node, ``helm test`` as a Pod, two stock Debian pods showing in their own log the files
containerd injected from the driver's CDI spec and the line the served (fake)
``libthunder.so`` prints once preloaded, cleanup and the leak audit. Elsewhere,
or with ``--simulated``, it runs the simulated nodes and says why.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from hack.cluster import Cluster
from hack.cluster.launcher import binaries
from hack.fake_thunder import FakeThunderProcess, start_fake_thunder
from hack.fake_thunder.library import loader_errors, preloaded_lines
from hack.testbed import daemon as daemon_harness
from hack.testbed import operator as operator_harness
from hack.testbed.kube import Kube, wait_for

RESOURCE = "resource.k8s.io/v1"
CLIENTS = "thundercompute.com/v1alpha1"
LABELS = "app.kubernetes.io/name=thunder-dra-driver"
BOLD, DIM, RESET = ("\033[1m", "\033[2m", "\033[0m") if sys.stdout.isatty() else ("", "", "")


def step(title: str) -> None:
    print(f"\n{BOLD}== {title}{RESET}", flush=True)


def kubectl(cluster: Cluster, *args: str) -> str:
    print(f"{DIM}$ kubectl {' '.join(args)}{RESET}", flush=True)
    out = subprocess.run(
        [str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    print(out, end="", flush=True)
    return out


@contextmanager
def node(kube: Kube, fake: FakeThunderProcess, zone: str, serving: bool) -> Iterator[Any]:
    harness = daemon_harness.NodeHarness(kube, fake, zone=zone, serving=serving)
    with harness:
        if serving:
            harness.daemon.host.set_nvidia(gpus=["NVIDIA RTX A6000"] * 4, gpu_type="A6000")
        harness.daemon.start()
        harness.daemon.wait_serving()
        yield harness


def pod(name: str, resources: dict[str, Any], claims: list[dict[str, str]] | None) -> Any:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "tester",
                "image": "ubuntu:24.04",
                "command": ["bash", "-lc", "nvidia-smi && sleep 3600"],
                "resources": resources,
            }
        ],
    }
    if claims:
        spec["resourceClaims"] = claims
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def running(kube: Kube, ns: str, name: str) -> bool:
    obj = kube.get("v1", "Pod", name, ns) or {}
    return (obj.get("status") or {}).get("phase") == "Running"


def secrets_of(fake: FakeThunderProcess) -> list[str]:
    state = fake.admin.state()
    found = [t["token"] for t in state.get("apiTokens", [])]
    found += [
        t["enrollmentToken"] for t in state.get("enrollmentTokens", []) if t.get("enrollmentToken")
    ]
    return found


def real_node_unavailable() -> str | None:
    """Why the demo cannot run on a real node here, or None."""
    from hack import image as image_builder
    from hack.node import NodeError, node_tools, node_unavailable

    try:
        return node_unavailable(node_tools()) or image_builder.unavailable()
    except (NodeError, OSError) as err:
        return str(err)


def real_node_demo() -> int:
    from hack.node import Node, node_tools
    from hack.node.chart import (
        INJECTED,
        NAMESPACE,
        RELEASE,
        ZONE,
        installed,
        node_config_for_chart,
        node_images,
        wait,
    )
    from hack.node.launcher import leftovers, node_cluster_config, one_node_at_a_time
    from hack.testbed.daemon import claim_template

    started = time.monotonic()
    step("Node components and images (built once, then cached)")
    tools = node_tools()
    print(f"kubelet {tools.kubelet}\ncontainerd {tools.containerd_bin}")
    images = node_images(binaries() / "kubectl")
    for name, image in images.items():
        print(f"{name:9} {image.ref}")
    print(f"ready in {time.monotonic() - started:.1f}s")

    # Held until the leftovers are counted (an exception ends the process, and the lock).
    lock = ExitStack()
    lock.enter_context(one_node_at_a_time())
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="thunder-demo-")))
        step("Local control plane and a real node: containerd (CDI), runc, CNI, kubelet")
        cluster = stack.enter_context(Cluster(workdir=work / "cp", config=node_cluster_config()))
        config = node_config_for_chart(cluster.ca_cert, tuple(i.archive for i in images.values()))
        node = stack.enter_context(Node(cluster, config))
        print(f"node {config.name} Ready {node.ready_after:.1f}s after its launcher started")
        kubectl(cluster, "get", "nodes", "-o", "wide", "-L", "topology.kubernetes.io/zone")

        step("The README's install: token Secret, CRDs, helm install (fake Thunder over https)")
        install = stack.enter_context(installed(node, images, work))
        print("\n".join(install.install_output.splitlines()[:6]))
        kubectl(cluster, "-n", NAMESPACE, "get", "deployments,daemonsets")

        step("The daemon pod registers with the kubelet and enrolls the node (nsenter)")
        wait(install.ready_daemon_pod, "a Ready daemon pod", timeout=240)
        host = wait(install.enrolled_host, "the node registered with Thunder", timeout=240)
        print(f"Thunder host {host['hostname']}: {host['gpuCount']}x {host['gpuType']} ")
        kubectl(cluster, "-n", NAMESPACE, "get", "pods", "-o", "wide")
        zone_id = wait(install.zone_id, f"zone {ZONE} in Thunder")
        fake = install.fake
        fake.admin.set_targets(zone_id, {"A6000": 1.5})
        print(f"Thunder oversubscription target for {ZONE} / A6000: 1.5")

        step("helm test, as a Pod on the node")
        wait(lambda: install.get("deviceclass", "thunder-gpu-a6000"), "the A6000 DeviceClass")
        out = install.helm("test", RELEASE, "-n", NAMESPACE, "--timeout", "3m")
        print("\n".join(line for line in out.splitlines() if line.startswith(("TEST", "Phase"))))
        kubectl(cluster, "-n", NAMESPACE, "logs", f"{RELEASE}-test")

        step("Two stock Debian pods (no Thunder files in the image): limits, and a template")
        stock = images["stock"].ref
        kube = Kube(cluster.kubeconfig)
        ns = "demo"
        kubectl(cluster, "create", "namespace", ns)
        kube.create(claim_template("two-a6000", ns, "thunder-gpu-a6000", 2))
        container = {"name": "main", "image": stock, "imagePullPolicy": "Never",
                     "command": ["/bin/sh", "-c", INJECTED]}  # fmt: skip
        pods: dict[str, dict[str, Any]] = {
            "thunder-simple": {
                "containers": [
                    {**container, "resources": {"limits": {"thundercompute.com/gpu-a6000": "2"}}}
                ]
            },
            "thunder-pod-gpu": {
                "containers": [
                    {**container, "resources": {"claims": [{"name": "gpu", "request": "gpu"}]}}
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "two-a6000"}],
            },
        }
        for name, spec in pods.items():
            body = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, **spec}
            kube.create_pod(ns, {"apiVersion": "v1", "kind": "Pod",
                                 "metadata": {"name": name}, "spec": body})  # fmt: skip
        for name in pods:
            wait(partial(finished, kube, ns, name), f"{name} to run", timeout=240)
        kubectl(cluster, "-n", ns, "get", "pods", "-o", "wide")
        secrets = install.secrets()
        for name in pods:
            step(f"{name}: its own log (containerd injected these from the CDI spec)")
            logs = kubectl(cluster, "-n", ns, "logs", name)
            leaked = any(s in logs for s in secrets)
            print("TOKEN FOUND" if leaked else "NO TOKEN in its environment or output")
            if leaked or "LD_PRELOAD=/etc/thunder/libthunder.so" not in logs:
                raise SystemExit(f"{name}: the injection is not as expected")
            refused, preloaded = loader_errors(logs), preloaded_lines(logs)
            if refused or not preloaded:
                raise SystemExit(f"{name}: libthunder.so was not preloaded: {refused or logs}")
            print(f"libthunder.so preloaded into {len(preloaded)} processes, no ld.so error:")
            print(f"  {preloaded[0]}")

        step("Cleanup: pods deleted, the kubelet unprepares, enrollments revoked")
        for name in pods:
            kube.core.delete_namespaced_pod(name, ns)
        wait(lambda: install.claims_gone(ns), "the claims and Clients removed", timeout=180)
        wait(lambda: not install.cdi_specs(), "the CDI specs removed", timeout=120)
        print(f"ResourceClaims, Clients and CDI specs left: 0, 0, {len(install.cdi_specs())}")
        leaks = fake.admin.leaks()
        print(f"Thunder audit: {len(leaks)} leaked enrollments")
        if leaks:
            raise SystemExit(f"leaked enrollments: {leaks}")
    rest = leftovers()
    lock.close()
    step(f"Done in {time.monotonic() - started:.1f}s; node removed, {len(rest)} leftovers")
    return 1 if rest else 0


def finished(kube: Kube, ns: str, name: str) -> bool:
    obj = kube.get("v1", "Pod", name, ns) or {}
    phase = (obj.get("status") or {}).get("phase")
    if phase == "Failed":
        raise SystemExit(f"pod {ns}/{name} failed")
    return phase == "Succeeded"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    why = "--simulated was given" if "--simulated" in args else real_node_unavailable()
    if why is None:
        return real_node_demo()
    print(f"No real node here ({why}): the demo runs on simulated nodes.", flush=True)
    return simulated_demo()


def simulated_demo() -> int:
    started = time.monotonic()
    step("Local control plane: etcd, kube-apiserver, kube-scheduler, kube-controller-manager")
    with ExitStack() as stack:
        cluster = stack.enter_context(Cluster())
        print(f"up in {time.monotonic() - started:.1f}s at {cluster.server}")
        kube = Kube(cluster.kubeconfig)
        logs = Path(tempfile.mkdtemp(prefix="thunder-demo-"))

        step("A fake Thunder service (stateful, loopback only)")
        fake = stack.enter_context(
            start_fake_thunder(
                tokens=[operator_harness.API_TOKEN, daemon_harness.API_TOKEN],
                log_path=logs / "fake-thunder.log",
                log_level="WARNING",
            )
        )
        print(f"Thunder API at {fake.base_url}")

        step("The operator and one ThunderCluster (token from a Secret, never a field)")
        env = stack.enter_context(operator_harness.operator_env(kube, cluster, fake, logs))
        kubectl(cluster, "get", "thunderclusters")

        step("Three nodes: a GPU server and a consumer in zone-a, a consumer in zone-b")
        server = stack.enter_context(node(kube, fake, "zone-a", serving=True))
        consumer = stack.enter_context(node(kube, fake, "zone-a", serving=False))
        stack.enter_context(node(kube, fake, "zone-b", serving=False))
        kubectl(
            cluster,
            "get",
            "nodes",
            "-L",
            "topology.kubernetes.io/zone",
            "-L",
            "thundercompute.com/node",
        )

        step("The serving node's daemon enrolls it; thunderd reports 4 A6000 to Thunder")
        zone_id = wait_for(lambda: _zone_id(fake, "zone-a"), "zone-a in Thunder", timeout=90)
        wait_for(lambda: _hosts(fake, zone_id), "the host registered with Thunder", timeout=90)
        for host in _hosts(fake, zone_id):
            count, model, status = host["gpuCount"], host["gpuType"], host["status"]
            print(f"Thunder host {host['hostname']}: {count}x {model} ({status})")
        fake.admin.set_targets(zone_id, {"A6000": 1.5})
        print("Thunder oversubscription target for zone-a / A6000: 1.5")

        step("The operator publishes one pool per zone + model and one DeviceClass per model")
        env.sync()
        wait_for(lambda: env.device_class("thunder-gpu-a6000"), "thunder-gpu-a6000")
        kubectl(
            cluster, "get", "deviceclasses", "-l", LABELS,
            "-o", "custom-columns=CLASS:.metadata.name,RESOURCE:.spec.extendedResourceName",
        )  # fmt: skip
        kubectl(
            cluster, "get", "resourceslices", "-l", LABELS,
            "-o", "custom-columns=POOL:.spec.pool.name,DEVICES:.spec.devices[*].name,"
            "TARGET:.metadata.labels.thundercompute\\.com/oversubscription",
        )  # fmt: skip
        kubectl(cluster, "get", "thunderclusters")

        with kube.namespace("demo") as ns:
            step("Two pods: a ResourceClaimTemplate for 2 GPUs, and resources.limits for 2")
            kube.create(
                daemon_harness.claim_template("thunder-pod-gpu", ns, "thunder-gpu-a6000", 2)
            )
            kube.create_pod(
                ns,
                pod(
                    "thunder-pod-gpu",
                    {"claims": [{"name": "gpu", "request": "gpu"}]},
                    [{"name": "gpu", "resourceClaimTemplateName": "thunder-pod-gpu"}],
                ),
            )
            kube.create_pod(
                ns, pod("thunder-simple", {"limits": {"thundercompute.com/gpu-a6000": "2"}}, None)
            )
            for name in ("thunder-pod-gpu", "thunder-simple"):
                wait_for(
                    partial(running, kube, ns, name), f"{name} prepared and Running", timeout=120
                )
            kubectl(cluster, "-n", ns, "get", "pods", "-o", "wide")

            step("Each claim: a Client record, a CDI device, a config.json; no token anywhere")
            kubectl(cluster, "get", "clients.thundercompute.com", "-A", "-o", "wide")
            tokens = secrets_of(fake)
            for harness in (server, consumer):
                for pod_uid in list(harness.kubelet.pods):
                    for claim_uid, ids in harness.kubelet.cdi_ids(pod_uid).items():
                        spec_file = (
                            harness.daemon.cdi_dir
                            / f"thundercompute.com-gpu_claim-{claim_uid}.json"
                        )
                        text = spec_file.read_text()
                        leaked = [t for t in tokens if t and t in text]
                        spec = json.loads(text)
                        env_names = [
                            e.split("=", 1)[0] for e in spec["devices"][0]["containerEdits"]["env"]
                        ]
                        mounts = spec["devices"][0]["containerEdits"]["mounts"]
                        print(
                            f"{harness.name}: claim {claim_uid[:8]} -> CDI {sorted(set(ids))[0]}\n"
                            f"  spec {spec_file.name}: env {', '.join(env_names)}; "
                            f"{len(mounts)} read-only mounts; "
                            f"{'NO TOKEN' if not leaked else 'TOKEN FOUND'}"
                        )
                        if leaked:
                            raise SystemExit("a token reached a CDI spec")

            step("Pods deleted: the kubelet stand-in unprepares; enrollments are revoked")
            for name in ("thunder-pod-gpu", "thunder-simple"):
                kube.core.delete_namespaced_pod(name, ns)
            wait_for(
                lambda: not kube.list_objects(CLIENTS, "Client", namespace=ns),
                "Clients removed",
                timeout=120,
            )
            remaining = kube.list_objects(CLIENTS, "Client", namespace=ns)
            print(f"Clients left in {ns}: {len(remaining)}")
            leaks = fake.admin.leaks()
            print(f"Thunder audit: {len(leaks)} leaked enrollments")
            if leaks:
                raise SystemExit(f"leaked enrollments: {leaks}")
    step(f"Done in {time.monotonic() - started:.1f}s; every process stopped")
    return 0


def _zone_id(fake: FakeThunderProcess, name: str) -> str | None:
    for zone in fake.admin.state().get("zones", []):
        if zone["displayName"] == name:
            return str(zone["zoneId"])
    return None


def _hosts(fake: FakeThunderProcess, zone_id: str) -> list[dict[str, Any]]:
    return [h for h in fake.admin.state().get("hosts", []) if h.get("zoneId") == zone_id]


if __name__ == "__main__":
    raise SystemExit(main())
