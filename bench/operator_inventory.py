"""Benchmark of the operator's inventory pass at the target scale.

    python -m bench.operator_inventory [--zones 500 --models 4 --gpus 64 --latency-ms 0]
                                       [--passes 3] [--no-write]

Seeds the fake Thunder with `zones x models` hosts of `gpus` GPUs each (every zone
serves every model), starts a local control plane and the operator as a real process
(`python -m thunder_dra.controllers --standalone`), and measures:

- the first publish: wall time from the operator's start to the end of its first pass,
  and the pass itself (the operator's own histogram);
- no-change passes (asked for through the `reconcile-requested` annotation);
- a restarted operator's first pass (it must write nothing);
- Thunder requests per pass (the operator's `thunder_dra_thunder_api_requests_total`), Kubernetes
  writes per pass (the API server's audit log, by the operator's user agent);
- the operator's peak RSS (`VmHWM` of `/proc/<pid>/status`), per process.

The figures go to the "Operator" section of docs/benchmarks.md (other sections are
left as they are) unless `--no-write`. This is not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.docsection import DOC, INTRO, command_line, machine, replace_section
from hack.cluster import Cluster
from hack.testbed.operator import (
    OPERATOR_AGENT,
    OperatorProcess,
    StandaloneOperator,
    metric_sum,
    standalone_operator,
)

SECTION = "## Operator"
MODELS = ("A6000", "H100", "L4", "A100", "RTX4090", "B200", "L40S", "H200")
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


@dataclass
class PassFigures:
    seconds: float
    thunder_requests: float
    kubernetes_writes: int
    writes_by_resource: dict[str, int] = field(default_factory=dict)
    cpu_seconds: float = 0.0
    """utime + stime of the operator process over the pass (from its start for a first
    pass)."""


def seed_state(zones: int, models: int, gpus: int) -> dict[str, Any]:
    """Fake Thunder state: every zone has one host per model with `gpus` GPUs."""
    zone_items, hosts = [], []
    for z in range(zones):
        zone_id = f"zone-{z:05d}"
        zone_items.append({"zoneId": zone_id, "displayName": f"bench-{z:04d}"})
        for m in range(models):
            model = MODELS[m % len(MODELS)] + ("" if m < len(MODELS) else f"-{m}")
            hosts.append(
                {
                    "hostId": f"host-{z:05d}-{m}",
                    "zoneId": zone_id,
                    "displayName": f"h{z}-{m}",
                    "hostname": f"h{z}-{m}",
                    "gpuType": model,
                    "gpuCount": gpus,
                    "status": "active",
                }
            )
    return {"zones": zone_items, "hosts": hosts}


def peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) / 1024 if match else float("nan")


def operator_writes(cluster: Cluster, since: int) -> tuple[int, dict[str, int], int]:
    """Writes by the operator in the audit log after index `since`, and the new index."""
    events = cluster.audit_events()
    by_resource: dict[str, int] = {}
    for event in events[since:]:
        agent = str(event.get("userAgent") or "")
        ref = event.get("objectRef") or {}
        if not agent.startswith(OPERATOR_AGENT) or event.get("verb") not in WRITE_VERBS:
            continue
        if "dryRun" in str(event.get("requestURI") or ""):
            continue
        resource = str(ref.get("resource") if isinstance(ref, dict) else "?")
        subresource = ref.get("subresource") if isinstance(ref, dict) else None
        key = f"{resource}/{subresource}" if subresource else resource
        by_resource[key] = by_resource.get(key, 0) + 1
    return sum(by_resource.values()), by_resource, len(events)


def _counters(operator: OperatorProcess) -> tuple[float, float]:
    """Inventory pass seconds and Thunder requests so far, from one `/metrics` read."""
    text = operator.metrics_text()
    return (
        metric_sum(text, "thunder_dra_operator_reconcile_duration_seconds_sum", kind="inventory"),
        metric_sum(text, "thunder_dra_thunder_api_requests_total"),
    )


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir

    def run(self) -> dict[str, Any]:
        args = self.args
        seed = seed_state(args.zones, args.models, args.gpus)
        with standalone_operator(
            self.workdir, seed, prefix="bench", latency_ms=args.latency_ms
        ) as world:
            return self._measure(world)

    @staticmethod
    def _figures(
        operator: OperatorProcess, cluster: Cluster, mark: int, base: tuple[float, float, float]
    ) -> PassFigures:
        """The figures since `base` (inventory seconds, Thunder requests, CPU seconds)."""
        cpu = operator.cpu_seconds()
        seconds, requests = _counters(operator)
        writes, by_resource, _ = operator_writes(cluster, mark)
        return PassFigures(
            seconds=seconds - base[0],
            thunder_requests=requests - base[1],
            kubernetes_writes=writes,
            writes_by_resource=by_resource,
            cpu_seconds=cpu - base[2],
        )

    def _pass(self, world: StandaloneOperator) -> PassFigures:
        operator = world.operator
        base = (*_counters(operator), operator.cpu_seconds())
        done = operator.passes_logged()
        _, _, mark = operator_writes(world.cluster, 0)
        world.request_pass()
        operator.wait_passes(done + 1, "a pass")
        return self._figures(operator, world.cluster, mark, base)

    def _start(self, world: StandaloneOperator, restart: bool) -> tuple[float, PassFigures]:
        """Start (or restart) the operator; the wall time to its first pass's end, and that
        pass's figures (CPU from the process's start)."""
        operator = world.operator
        _, _, mark = operator_writes(world.cluster, 0)
        started = time.monotonic()
        if restart:
            operator.restart()
        else:
            operator.start()
        operator.wait_passes(1, "the first pass")
        wall = time.monotonic() - started
        return wall, self._figures(operator, world.cluster, mark, (0.0, 0.0, 0.0))

    def _measure(self, world: StandaloneOperator) -> dict[str, Any]:
        operator = world.operator
        first_wall, first = self._start(world, restart=False)
        assert operator.popen is not None
        text = operator.metrics_text()
        devices = metric_sum(text, "thunder_dra_operator_pool_published_devices")
        pools = metric_sum(text, "thunder_dra_operator_pools")
        no_change = [self._pass(world) for _ in range(self.args.passes)]
        rss_first = peak_rss_mib(operator.popen.pid)

        restart_wall, restart_pass = self._start(world, restart=True)
        restart_no_change = self._pass(world)
        assert operator.popen is not None
        rss_restart = peak_rss_mib(operator.popen.pid)
        slices = len(
            world.kube.resource("resource.k8s.io/v1", "ResourceSlice")
            .get(label_selector="app.kubernetes.io/component=resource-inventory")
            .items
        )
        return {
            "pools": pools,
            "devices": devices,
            "slices": slices,
            "first_wall": first_wall,
            "first": first,
            "no_change": no_change,
            "restart_wall": restart_wall,
            "restart": restart_pass,
            "restart_no_change": restart_no_change,
            "rss_first": rss_first,
            "rss_restart": rss_restart,
        }


def _writes(figures: PassFigures) -> str:
    detail = ", ".join(f"{k} {v}" for k, v in sorted(figures.writes_by_resource.items()))
    return f"{figures.kubernetes_writes}" + (f" ({detail})" if detail else "")


def _inventory_writes(figures: PassFigures) -> int:
    return sum(
        count
        for resource, count in figures.writes_by_resource.items()
        if resource in ("resourceslices", "deviceclasses", "daemonsets")
    )


def render(args: argparse.Namespace, results: dict[str, Any], command: str) -> str:
    first: PassFigures = results["first"]
    no_change: list[PassFigures] = results["no_change"]
    restart: PassFigures = results["restart"]
    best = min(no_change, key=lambda f: f.seconds)
    worst = max(no_change, key=lambda f: f.seconds)
    peak = max(results["rss_first"], results["rss_restart"])
    steady = [*no_change, results["restart_no_change"], restart]
    inventory_writes = sum(_inventory_writes(f) for f in steady)
    other_writes = sum(f.kubernetes_writes for f in steady) - inventory_writes
    rss_ok = "meets" if peak <= 200 else "misses"
    writes_ok = "meets" if inventory_writes == 0 else "misses"
    lines = [
        SECTION,
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine()}; measured {time.strftime('%Y-%m-%d')}. The CPUs are shared "
        "with the control plane, the fake Thunder and whatever else runs, so times move "
        "with load; counts and RSS do not.",
        "",
        f"Inventory: {args.zones} zones x {args.models} models x {args.gpus} GPUs, "
        f"Thunder latency {args.latency_ms} ms per request; "
        f"{results['pools']:.0f} pools, {results['devices']:.0f} devices in "
        f"{results['slices']} ResourceSlices.",
        "",
        "| measurement | time | operator CPU | Thunder requests | Kubernetes writes |",
        "| --- | --- | --- | --- | --- |",
        f"| first publish, operator start to end of pass | {results['first_wall']:.1f} s "
        f"| {first.cpu_seconds:.1f} s | | |",
        f"| first publish, the pass | {first.seconds:.1f} s | | {first.thunder_requests:.0f} "
        f"| {_writes(first)} |",
        *(
            f"| no-change pass {i + 1} | {f.seconds:.2f} s | {f.cpu_seconds:.2f} s "
            f"| {f.thunder_requests:.0f} | {_writes(f)} |"
            for i, f in enumerate(no_change)
        ),
        f"| restarted operator, start to end of first pass | {results['restart_wall']:.1f} s "
        f"| {restart.cpu_seconds:.1f} s | | |",
        f"| restarted operator, first pass | {restart.seconds:.2f} s | "
        f"| {restart.thunder_requests:.0f} | {_writes(restart)} |",
        f"| restarted operator, next no-change pass "
        f"| {results['restart_no_change'].seconds:.2f} s "
        f"| {results['restart_no_change'].cpu_seconds:.2f} s "
        f"| {results['restart_no_change'].thunder_requests:.0f} "
        f"| {_writes(results['restart_no_change'])} |",
        "",
        f"Peak RSS of the operator process (VmHWM): {results['rss_first']:.0f} MiB through "
        f"the first publish and {len(no_change)} no-change passes; "
        f"{results['rss_restart']:.0f} MiB for a restarted process.",
        "",
        "Against the targets:",
        "",
        f"- RSS <= 200 MiB: {rss_ok} it (peak {peak:.0f} MiB).",
        f"- 0 Kubernetes writes on a no-change pass: {writes_ok} it: {inventory_writes} writes "
        f"to ResourceSlices, DeviceClasses or the DaemonSet over {len(steady)} no-change "
        f"passes (a restarted operator's first pass included); {other_writes} other "
        f"write{'' if other_writes == 1 else 's'} (a status patch records a real change, such "
        "as the DaemonSet controller having observed the new DaemonSet after the first pass).",
        f"- Thunder reads bounded and concurrent: {1 + 3 * args.zones} requests per pass "
        "(zones, then hosts, clients and targets per zone), at most "
        "`spec.operator.inventoryConcurrency` (default 8) in flight; no-change passes "
        f"took {best.seconds:.2f} to {worst.seconds:.2f} s.",
        "",
        "Operator CPU is utime + stime of the operator process (`/proc/<pid>/stat`): over "
        "the pass for a no-change pass, from the process's start for a first pass. Passes "
        "are waited for through the operator's log, not its `/metrics`, so the waiting "
        "does not load the process measured. "
        "Thunder requests are counted once per attempt by the operator's client "
        "(`thunder_dra_thunder_api_requests_total`); writes come from the API server's audit log, "
        "filtered by the operator's user agent (status patches and events included, "
        "dry runs excluded). A no-change pass may still refresh status at most every "
        "5 minutes (docs/operator.md).",
        "",
    ]
    return "\n".join(lines)


def write_section(text: str, path: Path = DOC) -> None:
    """Replace (or add) the Operator section, leaving every other section alone."""
    replace_section(path, SECTION, text, intro=INTRO)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.operator_inventory", description=__doc__)
    parser.add_argument("--zones", type=int, default=500)
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--latency-ms", type=int, default=0)
    parser.add_argument("--passes", type=int, default=3, help="no-change passes to time")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    command = command_line(
        "bench.operator_inventory", args, ("zones", "models", "gpus", "latency_ms", "passes")
    )
    with tempfile.TemporaryDirectory(prefix="bench-operator-") as workdir:
        results = Bench(args, Path(workdir)).run()
    text = render(args, results, command)
    print(text)
    print(
        json.dumps({k: v for k, v in results.items() if isinstance(v, int | float)}),
        file=sys.stderr,
    )
    if not args.no_write:
        write_section(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
