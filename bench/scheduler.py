"""Scheduler benchmark: zone pools against the same devices published node-local.

    python -m bench.scheduler [--nodes 500 --zones 10 --models 4 --gpus 256 --pods 200]
        [--layouts zone,node] [--request claim|extended] [--zone-affinity]
        [--attributes operator|seed]
        [--selector operator|attribute-first|driver-first|attribute-only]
        [--slice-size 128] [--node-selector operator|zone-only]
        [--percentage-of-nodes-to-score N] [--scheduler-binary PATH]
        [--profile SECONDS] [--timeout 600] [--out DIR]

For each layout, back to back, on a fresh local control plane (hack/cluster, the
v1.37.2 build): N simulated Ready nodes in Z zones (hack/cluster/nodes.py), M models
with G devices per zone and model, published as the operator publishes them (zone
pools, bench/scheduler_layouts.py) or node-local (one slice per node and model with
`nodeName`), one DeviceClass per model from the operator's builder. P pods, models
round-robin, each with one ResourceClaim of one GPU (`--request claim`: claims made
up front) or one GPU through the class's extended resource (`--request extended`: the
scheduler makes the claim). Pods are created behind a scheduling gate, then all gates
are lifted at once; a watch records when each pod gets its node. Reported: pods per
second over the whole run and between the 10th and 90th percentile of bindings, the
curve (pods bound per `--interval`, and pods per second of each run of `--window`
consecutive bindings), the load average beside each figure, optionally a CPU profile
of the scheduler (its /debug/pprof/profile, read with the admin client certificate,
summarised with `go tool pprof`), and a check that every allocation
names a device of the pod's node's zone (zone pools) or of the pod's node.

Every phase is bounded in time (`--timeout` for the scheduling phase): the benchmark
stops by itself and reports what was bound. Results are appended as JSON lines to
`<out>/results.jsonl`. This is not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, watch

from bench.scheduler_layouts import (
    ATTRIBUTE_SETS,
    NODE_SELECTORS,
    SELECTORS,
    DriverChoices,
    Inventory,
    Shape,
    claim_manifest,
    node_local_inventory,
    pod_manifest,
    zone_inventory,
)
from hack.cluster import Cluster, ClusterConfig
from hack.cluster.nodes import create_node

RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSION = "v1"
PROFILE_FUNCTIONS = (
    "structured.(*Allocator).Allocate",  # not present by that name; see summarise_profile
    "selectorsMatch",
    "DeviceMatches",
    "Convert_api_Device_To_v1_Device",
    "GatherPools",
    "Convert_v1_ResourceSlice_To_api_ResourceSlice",
    "NodeMatches",
    "validateDeviceNames",
    "allocateOne",
    "findNodesThatPassFilters",
    "mallocgc",
    "gcBgMarkWorker",
)


@dataclass
class RunResult:
    layout: str
    request: str
    shape: dict[str, int]
    pods: int
    choices: str
    scheduler: str
    zone_affinity: bool
    percentage_of_nodes_to_score: int | None
    devices: int
    slices: int
    bound: int = 0
    seconds: float = 0.0
    pods_per_second: float = 0.0
    steady_pods_per_second: float = 0.0
    curve: list[int] = field(default_factory=list)
    curve_interval: float = 5.0
    windows: list[float] = field(default_factory=list)
    """Pods per second of each run of `window` consecutive bindings (the curve by pods)."""
    window: int = 10
    scheduler_cpu_ms_per_pod: float = 0.0
    loadavg_before: str = ""
    loadavg_after: str = ""
    allocation_check: str = ""
    profile: dict[str, float] = field(default_factory=dict)
    profile_file: str = ""
    started: str = ""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def parallel(fn: Callable[[Any], object], items: Iterable[Any], workers: int = 8) -> None:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in pool.map(fn, items):
            pass


def api_clients(kubeconfig: Path) -> tuple[client.ApiClient, client.CoreV1Api, Any]:
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = 16
    api = client.ApiClient(configuration)
    return api, client.CoreV1Api(api), client.CustomObjectsApi(api)


def create_nodes(core: client.CoreV1Api, shape: Shape) -> None:
    def make(n: int) -> None:
        create_node(core, shape.node_name(n), zone=shape.zone_name(shape.zone_of_node(n)))

    parallel(make, range(shape.nodes))


def publish(custom: Any, inventory: Inventory) -> None:
    for obj in inventory.classes:
        custom.create_cluster_custom_object(RESOURCE_GROUP, RESOURCE_VERSION, "deviceclasses", obj)

    def make(obj: dict[str, Any]) -> None:
        custom.create_cluster_custom_object(RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices", obj)

    parallel(make, inventory.slices)


def make_namespace(core: client.CoreV1Api, name: str) -> None:
    body: Any = {"metadata": {"name": name}}
    core.create_namespace(body)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            core.read_namespaced_service_account("default", name)
            return
        except client.ApiException as err:
            if err.status != 404:
                raise
        time.sleep(0.2)
    raise RuntimeError(f"namespace {name}: no default ServiceAccount after 60s")


class BindWatch:
    """Records, per pod, when the watch first saw it with a node."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.core = core
        self.namespace = namespace
        self.bound: dict[str, tuple[float, str]] = {}
        self._stop = threading.Event()
        self._watch = watch.Watch()  # type: ignore[no-untyped-call]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ready = threading.Event()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            listed = self.core.list_namespaced_pod(self.namespace)
            self._ready.set()
            try:
                for event in self._watch.stream(  # type: ignore[no-untyped-call]
                    self.core.list_namespaced_pod,
                    self.namespace,
                    resource_version=listed.metadata.resource_version if listed.metadata else None,
                    timeout_seconds=30,
                ):
                    pod = event["object"]
                    node = pod.spec.node_name if pod.spec else None
                    if node and pod.metadata.name not in self.bound:
                        self.bound[pod.metadata.name] = (time.monotonic(), node)
                    if self._stop.is_set():
                        return
            except Exception:  # a dropped watch is simply restarted
                time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._watch.stop()  # type: ignore[no-untyped-call]


def scheduler_profile(cluster: Cluster, seconds: int, dest: Path) -> bytes | None:
    kubeconfig = yaml.safe_load(cluster.kubeconfig.read_text())
    user = kubeconfig["users"][0]["user"]
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(user["client-certificate"], user["client-key"])
    url = f"https://127.0.0.1:{cluster.scheduler_port}/debug/pprof/profile?seconds={seconds}"
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=seconds + 30) as resp:
            data: bytes = resp.read()
    except OSError as err:
        print(f"profile failed: {err}", file=sys.stderr)
        return None
    dest.write_bytes(data)
    return data


def summarise_profile(path: Path) -> dict[str, float]:
    """Cumulative share of the samples per function of interest (go tool pprof -top -cum)."""
    proc = subprocess.run(
        ["go", "tool", "pprof", "-top", "-cum", "-nodecount=400", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    path.with_suffix(".top.txt").write_text(proc.stdout + proc.stderr)
    shares: dict[str, float] = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) < 6 or not parts[4].endswith("%"):
            continue
        name = " ".join(parts[5:])
        for wanted in PROFILE_FUNCTIONS:
            short = wanted.rsplit(".", 1)[-1]
            if name.endswith("." + short) or name.endswith(")." + short) or name == short:
                shares.setdefault(short, float(parts[4].rstrip("%")))
        if name.endswith(").Allocate") and "structured" in name:
            shares.setdefault("Allocate", float(parts[4].rstrip("%")))
        if name.endswith(").Filter") and "dynamicresources" in name:
            shares.setdefault("DynamicResources.Filter", float(parts[4].rstrip("%")))
    return shares


def check_allocations(
    custom: Any, namespace: str, shape: Shape, bound: dict[str, tuple[float, str]], layout: str
) -> str:
    """Every allocated claim's device comes from the pod's node's zone (or node)."""
    zone_of = {
        shape.node_name(n): shape.zone_name(shape.zone_of_node(n)) for n in range(shape.nodes)
    }
    claims = custom.list_namespaced_custom_object(
        RESOURCE_GROUP, RESOURCE_VERSION, namespace, "resourceclaims"
    )["items"]
    good = bad = 0
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation")
        reserved = (claim.get("status") or {}).get("reservedFor") or []
        if not allocation or not reserved:
            continue
        pod = reserved[0]["name"]
        if pod not in bound:
            continue
        node = bound[pod][1]
        pool = allocation["devices"]["results"][0]["pool"]
        owner = pool.split("/")[0]
        expected = zone_of[node] if layout == "zone pools" else node
        if owner == expected:
            good += 1
        else:
            bad += 1
    where = "zone" if layout == "zone pools" else "node"
    return f"{good} allocations on the pod's {where}, {bad} elsewhere"


def rates(times: list[float], t0: float) -> tuple[float, float, float]:
    if not times:
        return 0.0, 0.0, 0.0
    times = sorted(times)
    total = times[-1] - t0
    overall = len(times) / total if total > 0 else 0.0
    lo, hi = int(len(times) * 0.1), int(len(times) * 0.9) - 1
    steady = 0.0
    if hi > lo and times[hi] > times[lo]:
        steady = (hi - lo) / (times[hi] - times[lo])
    return total, overall, steady


def curve(times: list[float], t0: float, interval: float) -> list[int]:
    if not times:
        return []
    buckets = [0] * (int((max(times) - t0) // interval) + 1)
    for t in times:
        buckets[int((t - t0) // interval)] += 1
    return buckets


def windows(times: list[float], t0: float, size: int) -> list[float]:
    """Pods per second of consecutive runs of `size` bindings, the first from the ungating."""
    times = sorted(times)
    rates: list[float] = []
    start = t0
    for end in range(size, len(times) + 1, size):
        span = times[end - 1] - start
        rates.append(round(size / span, 2) if span > 0 else 0.0)
        start = times[end - 1]
    return rates


def run_layout(args: argparse.Namespace, layout: str, out: Path) -> RunResult:
    shape = Shape(args.nodes, args.zones, args.models, args.gpus)
    choices = DriverChoices(args.attributes, args.selector, args.slice_size, args.node_selector)
    inventory = (zone_inventory if layout == "zone" else node_local_inventory)(shape, choices)
    scheduler_config = None
    if args.percentage_of_nodes_to_score is not None:
        scheduler_config = {"percentageOfNodesToScore": args.percentage_of_nodes_to_score}
    cluster_config = ClusterConfig(
        audit=False,
        scheduler_config=scheduler_config,
        scheduler_binary=Path(args.scheduler_binary) if args.scheduler_binary else None,
    )
    result = RunResult(
        layout=inventory.layout,
        request=args.request,
        shape=asdict(shape),
        pods=args.pods,
        choices=choices.describe(),
        scheduler=args.scheduler_binary or "stock v1.37.2",
        zone_affinity=args.zone_affinity,
        percentage_of_nodes_to_score=args.percentage_of_nodes_to_score,
        devices=inventory.devices,
        slices=len(inventory.slices),
        started=time.strftime("%H:%M:%S"),
    )
    workdir = Path(tempfile.mkdtemp(prefix="thunder-bench-sched-"))
    with Cluster(workdir=workdir, config=cluster_config) as cluster:
        api, core, custom = api_clients(cluster.kubeconfig)
        phase = time.monotonic()
        create_nodes(core, shape)
        publish(custom, inventory)
        namespace = "bench"
        make_namespace(core, namespace)
        names = [f"p-{i:05d}" for i in range(args.pods)]

        def make_pod(i: int) -> None:
            model = i % shape.models
            zone = shape.zone_name(i % shape.zones) if args.zone_affinity else None
            if args.request == "claim":
                claim = f"c-{i:05d}"
                custom.create_namespaced_custom_object(
                    RESOURCE_GROUP,
                    RESOURCE_VERSION,
                    namespace,
                    "resourceclaims",
                    claim_manifest(claim, namespace, inventory.class_names[model]),
                )
                body = pod_manifest(names[i], namespace, claim=claim, zone=zone)
            else:
                body = pod_manifest(
                    names[i],
                    namespace,
                    extended_resource=inventory.extended_resources[model],
                    zone=zone,
                )
            pod: Any = body
            core.create_namespaced_pod(namespace, pod)

        parallel(make_pod, range(args.pods))
        print(
            f"[{layout}] set up {shape.nodes} nodes, {len(inventory.slices)} slices, "
            f"{inventory.devices} devices, {args.pods} pods in {time.monotonic() - phase:.1f}s",
            file=sys.stderr,
        )
        time.sleep(3)  # the scheduler's informers catch up with the slices and pods
        watcher = BindWatch(core, namespace)
        watcher.start()
        profile_thread = None
        profile_path = out / f"profile-{layout}-{int(time.time())}.pprof"
        if args.profile:
            profile_thread = threading.Thread(
                target=scheduler_profile, args=(cluster, args.profile, profile_path), daemon=True
            )
        result.loadavg_before = loadavg()
        scheduler_pid = cluster.pids["kube-scheduler"]
        cpu0 = cpu_seconds(scheduler_pid)
        t0 = time.monotonic()
        if profile_thread is not None:
            profile_thread.start()

        def ungate(name: str) -> None:
            core.patch_namespaced_pod(
                name, namespace, [{"op": "remove", "path": "/spec/schedulingGates"}]
            )

        parallel(ungate, names, workers=4)
        deadline = t0 + args.timeout
        while len(watcher.bound) < args.pods and time.monotonic() < deadline:
            time.sleep(0.2)
        cpu1 = cpu_seconds(scheduler_pid)
        result.loadavg_after = loadavg()
        watcher.stop()
        times = [t for t, _ in watcher.bound.values()]
        if times:
            result.scheduler_cpu_ms_per_pod = 1000 * (cpu1 - cpu0) / len(times)
        result.bound = len(times)
        result.seconds, result.pods_per_second, result.steady_pods_per_second = rates(times, t0)
        result.curve_interval = args.interval
        result.curve = curve(times, t0, args.interval)
        result.window = args.window
        result.windows = windows(times, t0, args.window)
        result.allocation_check = check_allocations(
            custom, namespace, shape, dict(watcher.bound), inventory.layout
        )
        if profile_thread is not None:
            profile_thread.join(args.profile + 40)
            if profile_path.exists():
                result.profile = summarise_profile(profile_path)
                result.profile_file = str(profile_path)
        api.close()  # type: ignore[no-untyped-call]
    return result


def format_result(r: RunResult) -> str:
    prof = ", ".join(f"{k} {v:.0f}%" for k, v in r.profile.items())
    return (
        f"{r.layout:10} {r.request:8} pods {r.bound}/{r.pods} in {r.seconds:.1f}s: "
        f"{r.pods_per_second:.2f} pods/s (steady {r.steady_pods_per_second:.2f}), "
        f"scheduler CPU {r.scheduler_cpu_ms_per_pod:.1f} ms/pod; "
        f"load {r.loadavg_before} -> {r.loadavg_after}; {r.allocation_check}; "
        f"curve/{r.curve_interval:.0f}s {r.curve}; pods/s per {r.window} pods {r.windows}"
        + (f"; profile: {prof}" if prof else "")
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scheduler",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--zones", type=int, default=10)
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=256, help="devices per zone and model")
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--layouts", default="zone,node", help="zone,node in the order to run")
    parser.add_argument("--request", choices=("claim", "extended"), default="claim")
    parser.add_argument("--zone-affinity", action="store_true", help="pods require a zone")
    parser.add_argument("--attributes", choices=ATTRIBUTE_SETS, default="operator")
    parser.add_argument("--selector", choices=SELECTORS, default="operator")
    parser.add_argument("--slice-size", type=int, default=128)
    parser.add_argument("--node-selector", choices=NODE_SELECTORS, default="operator")
    parser.add_argument("--percentage-of-nodes-to-score", type=int, default=None)
    parser.add_argument("--scheduler-binary", default=None)
    parser.add_argument("--profile", type=int, default=0, help="seconds of CPU profile")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--interval", type=float, default=5.0, help="curve bucket, seconds")
    parser.add_argument("--window", type=int, default=10, help="curve by pods: bindings per window")
    parser.add_argument(
        "--out", default=str(Path(tempfile.gettempdir()) / "thunder-bench-scheduler")
    )
    args = parser.parse_args(argv)
    if args.models > 8:
        parser.error("--models is at most 8")
    if args.nodes < args.zones:
        parser.error("--nodes must be at least --zones")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"load {loadavg()}",
        file=sys.stderr,
    )
    results = []
    for layout in args.layouts.split(","):
        if layout not in ("zone", "node"):
            raise SystemExit(f"--layouts: unknown layout {layout!r} (zone, node)")
        result = run_layout(args, layout, out)
        results.append(result)
        print(format_result(result), flush=True)
        with (out / "results.jsonl").open("a") as fh:
            fh.write(json.dumps(asdict(result)) + "\n")
    by_layout = {r.layout: r for r in results}
    zone, node = by_layout.get("zone pools"), by_layout.get("node-local")
    if zone and node and node.pods_per_second > 0 and node.steady_pods_per_second > 0:
        cpu = ""
        if zone.scheduler_cpu_ms_per_pod > 0:
            share = node.scheduler_cpu_ms_per_pod / zone.scheduler_cpu_ms_per_pod
            cpu = f", scheduler CPU per pod {share:.2f}"
        print(
            f"ratio zone/node: {zone.pods_per_second / node.pods_per_second:.2f} overall, "
            f"{zone.steady_pods_per_second / node.steady_pods_per_second:.2f} steady{cpu} "
            "(node-local / zone pools)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
