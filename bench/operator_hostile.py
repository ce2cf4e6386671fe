"""Benchmark of the operator under a hostile, capped Thunder inventory.

    python -m bench.operator_hostile [--zones 25 --models 4 --hosts 16 --gpus 100]
                                     [--huge-gpus 5000000] [--no-write]

Seeds the fake Thunder with `zones x models` pools of `hosts` hosts that each report
`gpus` GPUs (above the default `maxGPUsPerHost` of 64, so every host is clamped), plus
one host reporting `huge-gpus` GPUs, so that the published (capped) inventory is about
100,000 devices within the default `spec.operator.limits`. It starts a local control
plane and the operator as a real process and measures:

- the first publish and one no-change pass: pass time, Thunder requests, devices and
  ResourceSlices published, the `InventoryClamped` Warning event;
- the operator's RSS, sampled every 50 ms, and its peak (`VmHWM`);
- the worst `/healthz` response time while a pass runs (polled every 100 ms): a pass
  that blocks the event loop shows here;
- SIGTERM sent in the middle of a no-change pass, and in the middle of a pass that
  republishes every slice: time until the process has exited.

Traffic goes to loopback only; every wait is bounded. The figures go to the
"Operator: hostile inventory" section of docs/benchmarks.md (other sections are left
as they are) unless `--no-write`. This is not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.docsection import DOC, INTRO, command_line, machine, replace_section
from bench.operator_inventory import MODELS, peak_rss_mib
from hack import supervise
from hack.testbed.kube import wait_for
from hack.testbed.operator import StandaloneOperator, standalone_operator

SECTION = "## Operator: hostile inventory"
AFTER = "## Operator"
DEFAULT_LIMITS = {
    "maxDevices": 131072,
    "maxDevicesPerPool": 4096,
    "maxPools": 4096,
    "maxGPUsPerHost": 64,
}
PASS_TIMEOUT = 900.0


def seed_state(
    zones: int, models: int, hosts: int, gpus: int, huge: int, wide: int
) -> dict[str, Any]:
    """`zones x models` pools of `hosts` hosts of `gpus` GPUs, one host of `huge` GPUs
    and one pool of `wide` hosts of `gpus` GPUs (above maxDevicesPerPool), in zone 0."""
    zone_items, host_items = [], []
    for z in range(zones):
        zone_id = f"zone-{z:05d}"
        zone_items.append({"zoneId": zone_id, "displayName": f"hostile-{z:04d}"})
        for m in range(models):
            model = MODELS[m % len(MODELS)] + ("" if m < len(MODELS) else f"-{m}")
            for h in range(hosts):
                host_items.append(
                    {
                        "hostId": f"host-{z:05d}-{m}-{h}",
                        "zoneId": zone_id,
                        "displayName": f"h{z}-{m}-{h}",
                        "hostname": f"h{z}-{m}-{h}",
                        "gpuType": model,
                        "gpuCount": gpus,
                        "status": "active",
                    }
                )
    host_items.extend(
        {
            "hostId": f"host-wide-{h}",
            "zoneId": zone_items[0]["zoneId"],
            "displayName": f"wide-{h}",
            "hostname": f"wide-{h}",
            "gpuType": "WIDE",
            "gpuCount": gpus,
            "status": "active",
        }
        for h in range(wide)
    )
    host_items.append(
        {
            "hostId": "host-huge",
            "zoneId": zone_items[0]["zoneId"],
            "displayName": "huge",
            "hostname": "huge",
            "gpuType": "HUGE",
            "gpuCount": huge,
            "status": "active",
        }
    )
    return {"zones": zone_items, "hosts": host_items}


class RssSampler(threading.Thread):
    """Samples VmRSS of one process every `interval` seconds until stopped."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.peak_mib = 0.0
        self.samples = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                status = Path(f"/proc/{self.pid}/status").read_text()
            except OSError:
                return
            match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
            if match:
                self.samples += 1
                self.peak_mib = max(self.peak_mib, int(match.group(1)) / 1024)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)


@dataclass
class HealthPoller:
    """Polls /healthz every `interval` seconds between start() and stop()."""

    url: str
    interval: float = 0.1
    latencies: list[float] = field(default_factory=list)
    failures: int = 0
    _stop_event: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop_event.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop_event.is_set():
            started = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=30) as response:
                    response.read()
                    if response.status != 200:
                        self.failures += 1
            except (urllib.error.URLError, OSError):
                self.failures += 1
            elapsed = time.monotonic() - started
            self.latencies.append(elapsed)
            self._stop_event.wait(max(0.0, self.interval - elapsed))

    def stop(self) -> None:
        self._stop_event.set()
        if self._thread is not None:
            self._thread.join(timeout=35)

    @property
    def worst(self) -> float:
        return max(self.latencies, default=float("nan"))


@dataclass
class PassFigures:
    seconds: float
    thunder_requests: float
    worst_healthz: float
    healthz_polls: int
    healthz_failures: int


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir

    def run(self) -> dict[str, Any]:
        args = self.args
        seed = seed_state(
            args.zones, args.models, args.hosts, args.gpus, args.huge_gpus, args.wide_hosts
        )
        with standalone_operator(self.workdir, seed, prefix="hostile") as world:
            return self._measure(world)

    def _measure(self, world: StandaloneOperator) -> dict[str, Any]:
        kube, operator, name = world.kube, world.operator, world.name
        health_url = f"http://127.0.0.1:{operator.health_port}/healthz"
        started = time.monotonic()
        operator.start()
        assert operator.popen is not None
        sampler = RssSampler(operator.popen.pid)
        sampler.start()

        poller = HealthPoller(health_url)
        poller.start()
        operator.wait_passes(1, "the first publish", timeout=PASS_TIMEOUT)
        poller.stop()
        first_wall = time.monotonic() - started
        first = PassFigures(
            seconds=operator.metric(
                "thunder_dra_operator_reconcile_duration_seconds_sum", kind="inventory"
            ),
            thunder_requests=operator.metric("thunder_dra_thunder_api_requests_total"),
            worst_healthz=poller.worst,
            healthz_polls=len(poller.latencies),
            healthz_failures=poller.failures,
        )
        devices = operator.metric("thunder_dra_operator_pool_published_devices")
        pools = operator.metric("thunder_dra_operator_pools")
        slices = len(
            kube.resource("resource.k8s.io/v1", "ResourceSlice")
            .get(label_selector="app.kubernetes.io/component=resource-inventory")
            .items
        )
        clamped = [
            e
            for e in kube.core.list_event_for_all_namespaces(
                field_selector="reason=InventoryClamped"
            ).items
            if e.involved_object.name == name
        ]

        # A no-change pass, with /healthz polled throughout.
        before_seconds = first.seconds
        before_requests = first.thunder_requests
        done = operator.passes_logged()
        poller = HealthPoller(health_url)
        poller.start()
        world.request_pass()
        operator.wait_passes(done + 1, "a no-change pass", timeout=PASS_TIMEOUT)
        poller.stop()
        no_change = PassFigures(
            seconds=operator.metric(
                "thunder_dra_operator_reconcile_duration_seconds_sum", kind="inventory"
            )
            - before_seconds,
            thunder_requests=operator.metric("thunder_dra_thunder_api_requests_total")
            - before_requests,
            worst_healthz=poller.worst,
            healthz_polls=len(poller.latencies),
            healthz_failures=poller.failures,
        )

        # SIGTERM in the middle of the next pass (half way through, by the last one).
        starts = operator.metric("thunder_dra_operator_inventory_pass_starts_total")
        world.request_pass()
        wait_for(
            lambda: (
                operator.metric("thunder_dra_operator_inventory_pass_starts_total") >= starts + 1
            ),
            "the next pass to start",
            timeout=PASS_TIMEOUT,
        )
        time.sleep(no_change.seconds / 2)
        in_pass = operator.passes_logged() == done + 1
        popen = operator.popen
        assert popen is not None
        rss_before_exit = peak_rss_mib(popen.pid)
        signalled = time.monotonic()
        code = popen.returncode if supervise.stop(popen, 120) else None
        exit_seconds = time.monotonic() - signalled
        sampler.stop()
        operator.popen = None

        # SIGTERM in the middle of a publishing pass: every slice removed, a new operator
        # republishes them all; half way through (by the first publish), it is stopped.
        kube.resource("resource.k8s.io/v1", "ResourceSlice").delete(
            label_selector="app.kubernetes.io/component=resource-inventory"
        )
        operator.start()
        wait_for(
            lambda: operator.metric("thunder_dra_operator_inventory_pass_starts_total") >= 1,
            "the republishing pass to start",
            timeout=PASS_TIMEOUT,
        )
        time.sleep(first.seconds / 2)
        publish_in_pass = operator.passes_logged() == 0
        republished = len(
            kube.resource("resource.k8s.io/v1", "ResourceSlice")
            .get(label_selector="app.kubernetes.io/component=resource-inventory")
            .items
        )
        republisher = operator.popen
        assert republisher is not None
        signalled = time.monotonic()
        publish_code = republisher.returncode if supervise.stop(republisher, 120) else None
        publish_exit_seconds = time.monotonic() - signalled
        operator.popen = None
        return {
            "pools": pools,
            "devices": devices,
            "slices": slices,
            "clamped": [str(e.message) for e in clamped],
            "clamped_types": sorted({str(e.type) for e in clamped}),
            "first_wall": first_wall,
            "first": first,
            "no_change": no_change,
            "sigterm_in_pass": in_pass,
            "sigterm_seconds": exit_seconds,
            "exit_code": code,
            "publish_sigterm_in_pass": publish_in_pass,
            "publish_sigterm_seconds": publish_exit_seconds,
            "publish_exit_code": publish_code,
            "republished_slices": republished,
            "rss_sampled_peak": sampler.peak_mib,
            "rss_samples": sampler.samples,
            "vmhwm": rss_before_exit,
        }


def _shorten(message: str, width: int = 160) -> str:
    """Each limit's part of a clamp message, cut to `width` characters."""
    parts = [part.strip() for part in message.split(";")]
    return "; ".join(p if len(p) <= width else p[:width].rstrip() + " ..." for p in parts)


def render(args: argparse.Namespace, results: dict[str, Any], command: str) -> str:
    first: PassFigures = results["first"]
    no_change: PassFigures = results["no_change"]
    hosts = args.zones * args.models * args.hosts + args.wide_hosts + 1
    reported = (args.zones * args.models * args.hosts + args.wide_hosts) * args.gpus
    reported += args.huge_gpus
    clamped: list[str] = results["clamped"]
    clamp_text = (
        f"seen: {len(clamped)} `InventoryClamped` event(s) of type "
        f"{', '.join(results['clamped_types'])}; first message: "
        f'"{_shorten(clamped[0])}"'
        if clamped
        else "not seen"
    )
    code = results["exit_code"]
    exit_text = f"exit code {code}" if code is not None else "did not exit within 120 s (killed)"
    publish_code = results["publish_exit_code"]
    publish_exit = (
        f"exit code {publish_code}"
        if publish_code is not None
        else "did not exit within 120 s (killed)"
    )
    publish_when = (
        "during a publishing pass"
        if results["publish_sigterm_in_pass"]
        else "after the publishing pass had ended"
    )
    when = "during a pass" if results["sigterm_in_pass"] else "after the pass had ended"
    limits = ", ".join(f"{k} {v}" for k, v in DEFAULT_LIMITS.items())
    lines = [
        SECTION,
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine()}; measured {time.strftime('%Y-%m-%d')}. The CPUs are shared "
        "with the control plane, the fake Thunder and whatever else runs, so times move "
        "with load; counts do not.",
        "",
        f"Inventory: {args.zones} zones x {args.models} models x {args.hosts} hosts each "
        f"reporting {args.gpus} GPUs, plus one pool of {args.wide_hosts} such hosts "
        f"and one host reporting {args.huge_gpus:,} GPUs: "
        f"{hosts} hosts reporting {reported:,} GPUs. Default limits ({limits}). "
        f"Published: {results['pools']:.0f} pools, {results['devices']:.0f} devices in "
        f"{results['slices']} ResourceSlices.",
        "",
        "| measurement | time | Thunder requests | worst /healthz (polls, failures) |",
        "| --- | --- | --- | --- |",
        f"| first publish, operator start to end of pass | {results['first_wall']:.1f} s | | |",
        f"| first publish, the pass | {first.seconds:.1f} s | {first.thunder_requests:.0f} "
        f"| {first.worst_healthz * 1000:.0f} ms ({first.healthz_polls}, "
        f"{first.healthz_failures}) |",
        f"| no-change pass | {no_change.seconds:.1f} s | {no_change.thunder_requests:.0f} "
        f"| {no_change.worst_healthz * 1000:.0f} ms ({no_change.healthz_polls}, "
        f"{no_change.healthz_failures}) |",
        "",
        f"- Peak RSS of the operator: {results['rss_sampled_peak']:.0f} MiB sampled every "
        f"50 ms ({results['rss_samples']} samples); VmHWM {results['vmhwm']:.0f} MiB.",
        f"- SIGTERM sent {when} (half the no-change pass time after it started): the "
        f"operator exited after {results['sigterm_seconds']:.2f} s, {exit_text}.",
        f"- SIGTERM sent {publish_when} (all slices deleted, a new operator "
        f"republishing them, half the first-publish pass time after its pass started, "
        f"{results['republished_slices']} of {results['slices']} slices written back): "
        f"it exited after {results['publish_sigterm_seconds']:.2f} s, {publish_exit}.",
        f"- Clamp Warning event: {clamp_text}.",
        "",
        "The first-publish /healthz figure covers the operator's start up to the end of "
        "its first pass; the no-change figure covers the pass it was asked for. Thunder "
        "requests are the operator's `thunder_dra_thunder_api_requests_total`.",
        "",
    ]
    return "\n".join(lines)


def write_section(text: str, path: Path = DOC) -> None:
    """Replace (or add, after the Operator section) this section; others stay as they are."""
    replace_section(path, SECTION, text, intro=INTRO, after=AFTER)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.operator_hostile", description=__doc__)
    parser.add_argument("--zones", type=int, default=25)
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--hosts", type=int, default=16, help="hosts per pool")
    parser.add_argument("--gpus", type=int, default=100, help="GPUs each host reports")
    parser.add_argument("--huge-gpus", type=int, default=5_000_000)
    parser.add_argument(
        "--wide-hosts", type=int, default=80, help="hosts of the pool above maxDevicesPerPool"
    )
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    command = command_line(
        "bench.operator_hostile",
        args,
        ("zones", "models", "hosts", "gpus", "huge_gpus", "wide_hosts"),
    )
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as workdir:
        results = Bench(args, Path(workdir)).run()
    text = render(args, results, command)
    print(text)
    if not args.no_write:
        write_section(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
