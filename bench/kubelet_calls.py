"""Benchmark of what the kubelet waits on: its DRA manager's prepare and unprepare calls to
the node daemon, side by side with the same calls to a minimal Go plugin (the floor).

    python -m bench.kubelet_calls [--claims 100] [--in-flight 20] [--write-docs] [--note TEXT]

Set-up (all local, nothing timed) is the daemon benchmark's (bench.daemon_prepare): a local
control plane, the fake Thunder service, one simulated client-only node with its pool's
ResourceSlice, claims created up front with ``status.allocation`` and ``reservedFor`` (a
bare pod each), and the real daemon process. Beside the daemon runs ``floorplugin``, a DRA
kubelet plugin on the upstream helper (``k8s.io/dynamic-resource-allocation/kubeletplugin``)
that answers every claim with a CDI device ID and writes nothing.

Both are driven by ``drabench``: the kubelet's own DRA manager (``pkg/kubelet/cm/dra`` of
the pinned Kubernetes, with ``pkg/kubelet/pluginmanager`` registering the plugin from its
``plugins_registry`` directory), timing ``PrepareResources`` and ``UnprepareResources`` for
each pod, one pod at a time and then ``--in-flight`` at once. The two Go programs are built
from hack/tools/kubeletbench by hack/build-kubeletbench.sh. The cases alternate between the
two plugins in one run; each reports latency percentiles, claims per second, the kubelet's
own gRPC metric and the CPU time per claim of the plugin, the API server and the kubelet's
DRA code (/proc/<pid>/stat). ``--write-docs`` replaces the "Kubelet calls" section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.daemon_prepare import DRIVER, Claim, Environment, Series
from bench.docsection import DOC, INTRO, command_line, replace_section
from hack import supervise
from hack.tied import start_tied

REPO = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO / "hack" / "build-kubeletbench.sh"
GO_MODULE = REPO / "hack" / "tools" / "kubeletbench"
HEADING = "## Kubelet calls"
OURS = "ours"
FLOOR = "floor"
TARGET_PREPARE_RATIO = 2.5
TARGET_UNPREPARE_RATIO = 3.0
PREPARE_METHOD = "NodePrepareResources"
UNPREPARE_METHOD = "NodeUnprepareResources"


@dataclass(frozen=True)
class Case:
    """One drabench run: one plugin, one number of pods in flight."""

    plugin: str
    in_flight: int
    prepare: Series
    unprepare: Series
    wall_s: float
    cpu_ms: dict[str, float]
    """CPU time per prepare + unprepare of one claim: "plugin", "kube-apiserver", "kubelet"."""
    grpc_ms: dict[str, float]
    """The kubelet's gRPC metric: mean milliseconds per call, by method."""

    @property
    def calls(self) -> int:
        return len(self.prepare.seconds)

    @property
    def claims_per_second(self) -> float:
        return self.calls / self.wall_s


def parse_case(plugin: str, raw: dict[str, Any], clock_ticks: int) -> Case:
    """A Case from drabench's JSON result (CPU in clock ticks of ``clock_ticks`` per second)."""
    calls = len(raw["prepare_s"])
    names = {"plugin": "plugin", "kube-apiserver": "kube-apiserver", "drabench": "kubelet"}
    cpu = {
        label: raw["cpu_ticks"][name] / clock_ticks / calls * 1000 for name, label in names.items()
    }
    grpc = {
        method: totals["sum_s"] / totals["count"] * 1000
        for method, totals in raw["grpc"].items()
        if totals["count"]
    }
    in_flight = raw["in_flight"]
    return Case(
        plugin=plugin,
        in_flight=in_flight,
        prepare=Series(f"prepare, {in_flight} in flight", list(raw["prepare_s"])),
        unprepare=Series(f"unprepare, {in_flight} in flight", list(raw["unprepare_s"])),
        wall_s=raw["wall_s"],
        cpu_ms=cpu,
        grpc_ms=grpc,
    )


@dataclass(frozen=True)
class Machine:
    started: str
    arch: str
    cpus: int
    cpu_model: str
    python: str
    go: str
    kubernetes: str
    load_mean: float

    @staticmethod
    def describe(started: datetime, load_mean: float) -> Machine:
        model = ""
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        go = subprocess.run(
            ["go", "env", "GOVERSION"], capture_output=True, text=True, check=True
        ).stdout.strip()
        return Machine(
            started=started.strftime("%Y-%m-%d %H:%M UTC"),
            arch=platform.machine(),
            cpus=os.cpu_count() or 1,
            cpu_model=model,
            python=platform.python_version(),
            go=go,
            kubernetes=kubernetes_version(GO_MODULE / "go.mod"),
            load_mean=load_mean,
        )


def kubernetes_version(go_mod: Path) -> str:
    """The k8s.io/kubernetes version a go.mod requires."""
    for line in go_mod.read_text().splitlines():
        fields = line.replace("require", "").split()
        if len(fields) >= 2 and fields[0] == "k8s.io/kubernetes":
            return fields[1]
    raise SystemExit(f"{go_mod} does not require k8s.io/kubernetes")


def ratio(ours: float, floor: float) -> float:
    return ours / floor if floor > 0 else float("inf")


def _case(cases: Sequence[Case], plugin: str, in_flight: int) -> Case:
    return next(c for c in cases if c.plugin == plugin and c.in_flight == in_flight)


def _mean_ms(series: Series) -> float:
    return statistics.fmean(series.seconds) * 1000


def _fmt_ratio(value: float) -> str:
    return f"{value:.1f}x" if value < 10 else f"{value:.0f}x"


def render(cases: Sequence[Case], machine: Machine, command: str, note: str = "") -> str:
    """The "Kubelet calls" section of docs/benchmarks.md."""
    in_flights = sorted({c.in_flight for c in cases})
    rows = []
    for call in ("prepare", "unprepare"):
        for n in in_flights:
            ours: Series = getattr(_case(cases, OURS, n), call)
            floor: Series = getattr(_case(cases, FLOOR, n), call)
            rows.append(
                f"| {call} | {n} | {len(ours.seconds)} / {len(floor.seconds)} "
                f"| {ours.pct(0.5):.1f} | {floor.pct(0.5):.1f} "
                f"| {_fmt_ratio(ratio(ours.pct(0.5), floor.pct(0.5)))} "
                f"| {ours.pct(0.99):.1f} | {floor.pct(0.99):.1f} "
                f"| {_fmt_ratio(ratio(ours.pct(0.99), floor.pct(0.99)))} |"
            )
    columns = [(n, plugin) for n in in_flights for plugin in (OURS, FLOOR)]
    header = " | ".join(f"{plugin}, {n} in flight" for n, plugin in columns)

    def per_case(label: str, value: Any) -> str:
        cells = " | ".join(value(_case(cases, plugin, n)) for n, plugin in columns)
        return f"| {label} | {cells} |"

    def grpc(method: str) -> Any:
        return lambda c: f"{c.grpc_ms[method]:.1f}" if method in c.grpc_ms else "-"

    per_claim = [
        per_case("claims per second (prepare + unprepare)", lambda c: f"{c.claims_per_second:.1f}"),
        per_case("prepare, mean ms", lambda c: f"{_mean_ms(c.prepare):.1f}"),
        per_case("of which the plugin's gRPC call, mean ms", grpc(PREPARE_METHOD)),
        per_case("unprepare, mean ms", lambda c: f"{_mean_ms(c.unprepare):.1f}"),
        per_case("of which the plugin's gRPC call, mean ms", grpc(UNPREPARE_METHOD)),
        per_case("plugin process CPU per claim, ms", lambda c: f"{c.cpu_ms['plugin']:.1f}"),
        per_case("kube-apiserver CPU per claim, ms", lambda c: f"{c.cpu_ms['kube-apiserver']:.1f}"),
        per_case("kubelet DRA code CPU per claim, ms", lambda c: f"{c.cpu_ms['kubelet']:.1f}"),
    ]
    one, many = in_flights[0], in_flights[-1]
    prepare_ratio = ratio(
        _case(cases, OURS, one).prepare.pct(0.5), _case(cases, FLOOR, one).prepare.pct(0.5)
    )
    unprepare_ratio = ratio(
        _case(cases, OURS, one).unprepare.pct(0.5), _case(cases, FLOOR, one).unprepare.pct(0.5)
    )
    many_prepare = ratio(
        _case(cases, OURS, many).prepare.pct(0.5), _case(cases, FLOOR, many).prepare.pct(0.5)
    )
    many_unprepare = ratio(
        _case(cases, OURS, many).unprepare.pct(0.5), _case(cases, FLOOR, many).unprepare.pct(0.5)
    )
    throughput = ratio(
        _case(cases, FLOOR, many).claims_per_second, _case(cases, OURS, many).claims_per_second
    )

    def verdict(value: float, target: float) -> str:
        return "meets" if value <= target else "misses"

    load = (
        f"The 1-minute load average, sampled every 5 s during the run, had a mean of "
        f"{machine.load_mean:.1f} on these {machine.cpus} CPUs"
        + (
            ": the machine was busy with other work, so the absolute figures are slower "
            "than on an idle machine; the ratios come from the same minutes, the two "
            "plugins alternating."
            if machine.load_mean > machine.cpus
            else "."
        )
    )
    return "\n".join(
        [
            HEADING,
            "",
            f"Command: `{command}` ({machine.started}; {machine.arch}, {machine.cpus} CPUs "
            f"({machine.cpu_model}) shared by the control plane, the fake Thunder service, "
            f"both plugins and the kubelet's DRA code; Python {machine.python}, "
            f"{machine.go}, Kubernetes {machine.kubernetes} modules).",
            "",
            "What the kubelet waits on before a pod's containers start and when it ends, "
            "measured with the kubelet's own code: `drabench` (hack/tools/kubeletbench) runs "
            f"the DRA manager of Kubernetes {machine.kubernetes} (`pkg/kubelet/cm/dra`: "
            "`dra.NewManager`, `PrepareResources` and `UnprepareResources` for a pod), with "
            "the plugin registered by `pkg/kubelet/pluginmanager` from a `plugins_registry` "
            "directory and the kubelet's client settings (protobuf, 50 QPS, burst 100). A "
            "call's time is the manager's whole call for a pod with one claim: the claim "
            "read from the API server, the manager's checkpoint and the plugin's gRPC call. "
            '"ours" is the daemon process, set up as in the Daemon section (every prepare '
            'a fresh enrollment, every unprepare its revocation). "floor" is `floorplugin`, '
            "a DRA plugin on the upstream helper (`k8s.io/dynamic-resource-allocation/"
            "kubeletplugin`) that returns a CDI device ID per device and writes nothing: "
            "the helper reads the claim from the API server, calls are not serialized, its "
            "client has no rate limit. It is the least any driver pays for the protocol "
            "and the kubelet's own work. Both plugins run on the same simulated node "
            "against the same claims, in one run, alternating: "
            + ", ".join(f"{c.plugin} with {c.in_flight} in flight" for c in cases)
            + f'. "{many} in flight": {many} pods at once, each prepared and then '
            "unprepared before the next is taken.",
            "",
            "| call | in flight | calls (ours / floor) | ours p50 ms | floor p50 ms | ratio "
            "| ours p99 ms | floor p99 ms | ratio |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            *rows,
            "",
            f"| per case | {header} |",
            "| --- |" + " ---: |" * len(columns),
            *per_claim,
            "",
            "The gRPC rows are the kubelet's own `dra_grpc_operations_duration_seconds` "
            "(sum over count) for the same calls: the plugin's share of each call, the "
            "rest being the kubelet's own work (the claim read on prepare, the checkpoint "
            "on both). CPU per claim is a "
            "prepare plus an unprepare, from /proc/<pid>/stat over the timed calls.",
            "",
            "Ratios, ours over floor:",
            "",
            f"- one at a time, prepare p50 {_fmt_ratio(prepare_ratio)} (target "
            f"<= {TARGET_PREPARE_RATIO:g}x: {verdict(prepare_ratio, TARGET_PREPARE_RATIO)}), "
            f"unprepare p50 {_fmt_ratio(unprepare_ratio)} (target <= "
            f"{TARGET_UNPREPARE_RATIO:g}x: {verdict(unprepare_ratio, TARGET_UNPREPARE_RATIO)});",
            f"- {many} in flight, prepare p50 {_fmt_ratio(many_prepare)}, unprepare p50 "
            f"{_fmt_ratio(many_unprepare)}; the floor completes {_fmt_ratio(throughput)} as "
            "many claims per second.",
            "",
            load,
            *(["", note] if note else []),
            "",
        ]
    )


def write_docs(section: str, path: Path = DOC) -> None:
    """Replace the "Kubelet calls" section of docs/benchmarks.md (new: after "Daemon")."""
    replace_section(path, HEADING, section, intro=INTRO, after="## Daemon")


def build() -> Path:
    """Build (once, cached) drabench and floorplugin; their directory."""
    done = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{BUILD_SCRIPT.name} failed:\n{done.stderr}")
    return Path(done.stdout.strip().splitlines()[-1])


def pods_file(claims: Sequence[Claim], path: Path) -> Path:
    """The claims as drabench reads them: each with the pod it is reserved for."""
    path.write_text(
        json.dumps(
            [
                {"namespace": c.namespace, "claim": c.name, "pod": c.pod, "pod_uid": c.pod_uid}
                for c in claims
            ]
        )
    )
    return path


class Floor:
    """The floor plugin's process and directories."""

    def __init__(self, binary: Path, root: Path, kubeconfig: Path, node: str) -> None:
        self.registry = root / "plugins_registry"
        self.log = root / "floorplugin.log"
        root.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log.open("ab")
        command = [
            str(binary),
            "--kubeconfig", str(kubeconfig),
            "--driver-name", DRIVER,
            "--node", node,
            "--registry-dir", str(self.registry),
            "--plugin-dir", str(root / "plugin"),
        ]  # fmt: skip
        self.process = start_tied(
            command,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        socket = self.registry / f"{DRIVER}-reg.sock"
        deadline = time.monotonic() + 30
        while not socket.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"floorplugin did not start: {supervise.read_log(self.log)}")
            time.sleep(0.05)

    def stop(self) -> None:
        supervise.stop(self.process, 10)
        self._log_file.close()


def drive(
    drabench: Path,
    env: Environment,
    registry: Path,
    plugin_pid: int,
    pods: Path,
    in_flight: int,
    name: str,
) -> dict[str, Any]:
    """One drabench run against the plugin registered in ``registry``; its JSON result."""
    assert env.cluster is not None
    state = env.root / f"kubelet-{name}"
    state.mkdir()
    log = env.root / f"drabench-{name}.log"
    command = [
        str(drabench),
        "--kubeconfig", str(env.cluster.kubeconfig),
        "--node", env.node,
        "--registry-dir", str(registry),
        "--state-dir", str(state),
        "--claims", str(pods),
        "--in-flight", str(in_flight),
        "--cpu", f"plugin={plugin_pid}",
        "--cpu", f"kube-apiserver={env.cluster.pids['kube-apiserver']}",
    ]  # fmt: skip
    with log.open("wb") as stderr:
        done = subprocess.run(
            command,
            stdout=subprocess.PIPE,
            stderr=stderr,
            timeout=900,
        )
    if done.returncode != 0:
        raise SystemExit(f"drabench ({name}) failed: {supervise.log_tail(log, 30)}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@contextmanager
def load_sampler(every: float = 5.0) -> Iterator[list[float]]:
    """The 1-minute load average every ``every`` seconds while the block runs."""
    samples = [os.getloadavg()[0]]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(every):
            samples.append(os.getloadavg()[0])

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()
        samples.append(os.getloadavg()[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kubelet_calls", description=__doc__)
    parser.add_argument("--claims", type=int, default=100, help="calls per case")
    parser.add_argument("--in-flight", type=int, default=20)
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument(
        "--note", default="", help="a paragraph for the section, e.g. what else ran meanwhile"
    )
    args = parser.parse_args(argv)
    bin_dir = build()
    started = datetime.now(UTC)
    clock_ticks = os.sysconf("SC_CLK_TCK")
    cases: list[Case] = []
    with (
        load_sampler() as load,
        tempfile.TemporaryDirectory(prefix="bench-kubelet-") as workdir,
        Environment(args.claims, Path(workdir)) as env,
    ):
        env.prepare_cluster()
        assert env.cluster is not None
        daemon_pid = env.start_daemon()
        floor = Floor(bin_dir / "floorplugin", env.root / "floor", env.cluster.kubeconfig, env.node)
        try:
            pods = pods_file(env.claims, env.root / "pods.json")
            plugins = {
                OURS: (env.root / "plugins_registry", daemon_pid),
                FLOOR: (floor.registry, floor.process.pid),
            }
            for in_flight in (1, args.in_flight):
                for plugin, (registry, pid) in plugins.items():
                    raw = drive(
                        bin_dir / "drabench",
                        env,
                        registry,
                        pid,
                        pods,
                        in_flight,
                        f"{plugin}-{in_flight}",
                    )
                    cases.append(parse_case(plugin, raw, clock_ticks))
                    print(f"{plugin}, {in_flight} in flight: done", file=sys.stderr)
        finally:
            floor.stop()
    machine = Machine.describe(started, sum(load) / len(load))
    command = command_line("bench.kubelet_calls", args, ["claims", "in_flight"])
    section = render(cases, machine, command + " --write-docs", args.note)
    print(section)
    if args.write_docs:
        write_docs(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
