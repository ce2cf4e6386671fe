"""The kubelet-calls benchmark's results and its section of docs/benchmarks.md: the cases
drabench measured (:class:`Case`), the machine they ran on, and the rendering of the
latency and per-case tables, ratios and verdicts against the targets.

Kept apart from :mod:`bench.kubelet_calls`, which sets up the plugins and drives them, so
the arithmetic and the text can be tested without a cluster."""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.daemon_prepare import Series
from bench.docsection import DOC, INTRO, replace_section
from thunder_dra.kube.binding import ENROLLED

REPO = Path(__file__).resolve().parents[1]
GO_MODULE = REPO / "hack" / "tools" / "kubeletbench"
HEADING = "## Kubelet calls"
OURS = "ours"
FLOOR = "floor"
BEFORE = "before"
OURS_BINDING = "ours, enrolled before binding"
"""The plugin name of the cases of ours with ``--enroll-before-binding``."""
BEFORE_BINDING = "before, enrolled before binding"
"""The same cases of the baseline's daemon (when it has ``--enroll-before-binding``)."""
BINDING_PLUGINS = (BEFORE_BINDING, OURS_BINDING)
TARGET_PREPARE_RATIO = 2.5
TARGET_UNPREPARE_RATIO = 3.0
TARGET_BINDING_RATIO = 1.5
API_REQUEST_KINDS = ("reads", "writes")
REQUESTS_NOTE = (
    " Kubernetes requests per claim are the API server's own count"
    " (`apiserver_request_total`) of requests for ResourceClaims and `Client` records from"
    " every process (the kubelet's DRA code, the plugin), from before drabench's run to the"
    " end of the daemon's work after it, over the claims cycled (the timed ones and the"
    " warm-up's): reads are GETs, writes are creates, updates, patches, applies and deletes;"
    " the benchmark's own lists while it waits are not counted."
)
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
    round_p50_ms: tuple[tuple[float, float], ...] = ()
    """For a case run in rounds: each round's prepare and unprepare p50, in ms."""
    api_requests: dict[str, float] | None = None
    """The API server's requests of ResourceClaims and `Client` records per claim, from
    every process: "reads" (GET), "writes" (create, update, patch, apply, delete)."""

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
    counted = raw.get("api_requests")
    requests = None
    if counted is not None and counted["claims"]:
        requests = {kind: counted[kind] / counted["claims"] for kind in API_REQUEST_KINDS}
    return Case(
        plugin=plugin,
        in_flight=in_flight,
        prepare=Series(f"prepare, {in_flight} in flight", list(raw["prepare_s"])),
        unprepare=Series(f"unprepare, {in_flight} in flight", list(raw["unprepare_s"])),
        wall_s=raw["wall_s"],
        cpu_ms=cpu,
        grpc_ms=grpc,
        api_requests=requests,
    )


def merge_runs(raws: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """drabench's results of one case run in rounds, as one result: the calls of every
    round, their wall time, CPU ticks and gRPC totals added up."""
    if not raws:
        raise ValueError("no drabench result to merge")
    if len({raw["in_flight"] for raw in raws}) != 1:
        raise ValueError("drabench results of different numbers in flight")
    methods = sorted({m for raw in raws for m in raw["grpc"]})
    labels = sorted({label for raw in raws for label in raw["cpu_ticks"]})
    counted = [raw["api_requests"] for raw in raws if "api_requests" in raw]
    requests = {}
    if len(counted) == len(raws):
        requests["api_requests"] = {
            kind: sum(each[kind] for each in counted) for kind in ("claims", *API_REQUEST_KINDS)
        }
    return {
        "in_flight": raws[0]["in_flight"],
        "prepare_s": [x for raw in raws for x in raw["prepare_s"]],
        "unprepare_s": [x for raw in raws for x in raw["unprepare_s"]],
        "wall_s": sum(raw["wall_s"] for raw in raws),
        "cpu_ticks": {
            label: sum(raw["cpu_ticks"].get(label, 0) for raw in raws) for label in labels
        },
        "grpc": {
            m: {
                "count": sum(raw["grpc"].get(m, {}).get("count", 0) for raw in raws),
                "sum_s": sum(raw["grpc"].get(m, {}).get("sum_s", 0.0) for raw in raws),
            }
            for m in methods
        },
        **requests,
    }


def parse_rounds(plugin: str, raws: Sequence[dict[str, Any]], clock_ticks: int) -> Case:
    """A Case from the drabench results of its rounds: the figures of all rounds together,
    and each round's p50s."""
    case = parse_case(plugin, merge_runs(raws), clock_ticks)
    per_round = tuple(
        (Series("", raw["prepare_s"]).pct(0.5), Series("", raw["unprepare_s"]).pct(0.5))
        for raw in raws
    )
    return dataclasses.replace(case, round_p50_ms=per_round)


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


@dataclass(frozen=True)
class Baseline:
    """The commit whose daemon runs as "before"."""

    commit: str
    """Its short hash."""
    subject: str
    variant: str = ""
    """With a name, "before" is the commit's tree with ``bench/variants/<name>.patch``
    applied: a variant of the daemon made to measure what its work costs."""
    variant_summary: str = ""
    """What the variant changes, from its patch's description."""


def ratio(ours: float, floor: float) -> float:
    return ours / floor if floor > 0 else float("inf")


def _case(cases: Sequence[Case], plugin: str, in_flight: int) -> Case:
    return next(c for c in cases if c.plugin == plugin and c.in_flight == in_flight)


def _mean_ms(series: Series) -> float:
    return statistics.fmean(series.seconds) * 1000


def _fmt_ratio(value: float) -> str:
    return f"{value:.1f}x" if value < 10 else f"{value:.0f}x"


def against(before: float, ours: float) -> str:
    """How ours compares with before, from their latencies: "2.0x faster", "1.5x slower",
    "as fast (1.0x)" within rounding."""
    if ours <= 0 or before <= 0:
        return "not comparable"
    factor = _fmt_ratio(max(before, ours) / min(before, ours))
    if factor == _fmt_ratio(1.0):
        return f"as fast ({factor})"
    return f"{factor} faster" if before > ours else f"{factor} slower"


def _verdict(value: float, target: float) -> str:
    return "meets" if value <= target else "misses"


def _latency_row(call: str, n: int, compared: dict[str, Series | None], floor: Series) -> str:
    """One line of the latency table: calls, then p50 and p99 of each compared plugin, the
    floor's and each one's ratio over the floor ("-" for a plugin without the case)."""
    calls = " / ".join(
        [str(len(s.seconds)) if s else "-" for s in compared.values()] + [str(len(floor.seconds))]
    )
    cells = [call, str(n), calls]
    for q in (0.5, 0.99):
        cells += [f"{s.pct(q):.1f}" if s else "-" for s in compared.values()]
        cells.append(f"{floor.pct(q):.1f}")
        cells += [
            _fmt_ratio(ratio(s.pct(q), floor.pct(q))) if s else "-" for s in compared.values()
        ]
    return "| " + " | ".join(cells) + " |"


def _latency_header(compared: Sequence[str]) -> list[str]:
    names = " / ".join([*compared, FLOOR])
    ratios = ["ratio"] if len(compared) == 1 else [f"{p} / {FLOOR}" for p in compared]
    cells = ["call", "in flight", f"calls ({names})"]
    for q in ("p50", "p99"):
        cells += [f"{p} {q} ms" for p in compared] + [f"{FLOOR} {q} ms"] + ratios
    return [
        "| " + " | ".join(cells) + " |",
        "| --- | ---: |" + " ---: |" * (len(cells) - 2),
    ]


def heading(thunder_latency_ms: int = 0, run_ms: int = 0, variant: str = "") -> str:
    """The section's heading: its own for a run with Thunder answering late, for one
    whose pods run between their two calls, and for one beside a variant of the daemon."""
    title = HEADING
    if variant:
        title += f", variant {variant}"
    if thunder_latency_ms:
        title += f", Thunder {thunder_latency_ms} ms away"
    if run_ms:
        title += f", pods running {run_ms} ms"
    return title


def render(
    cases: Sequence[Case],
    machine: Machine,
    command: str,
    note: str = "",
    baseline: Baseline | None = None,
    thunder_latency_ms: int = 0,
    run_ms: int = 0,
) -> str:
    """The "Kubelet calls" section of docs/benchmarks.md; with ``baseline``, "before"
    beside ours; with cases of :data:`OURS_BINDING`, the enrollment-before-binding rows;
    with ``thunder_latency_ms``, the section of a run whose Thunder answered that late."""
    compared = [BEFORE, OURS] if baseline else [OURS]
    in_flights = sorted({c.in_flight for c in cases if c.plugin not in BINDING_PLUGINS})
    binding_flights = sorted({c.in_flight for c in cases if c.plugin == OURS_BINDING})
    binding_plugins = [p for p in BINDING_PLUGINS if any(c.plugin == p for c in cases)]
    binders = {OURS: OURS_BINDING, BEFORE: BEFORE_BINDING}
    rows = []
    for call in ("prepare", "unprepare"):
        for n in in_flights:
            series = {p: getattr(_case(cases, p, n), call) for p in compared}
            rows.append(_latency_row(call, n, series, getattr(_case(cases, FLOOR, n), call)))
    for n in binding_flights:
        binding = {
            p: _case(cases, binders[p], n).prepare if binders[p] in binding_plugins else None
            for p in compared
        }
        floor_prepare = _case(cases, FLOOR, n).prepare
        rows.append(_latency_row("prepare, enrolled before binding", n, binding, floor_prepare))
    columns = [(n, plugin) for n in in_flights for plugin in (*compared, FLOOR)]
    columns += [(n, plugin) for n in binding_flights for plugin in binding_plugins]
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
    counted_requests = any(c.api_requests is not None for c in cases)
    if counted_requests:
        per_claim.append(
            per_case(
                "Kubernetes requests per claim, reads / writes",
                lambda c: (
                    "-"
                    if c.api_requests is None
                    else f"{c.api_requests['reads']:.1f} / {c.api_requests['writes']:.1f}"
                ),
            )
        )
    rounds = max(len(c.round_p50_ms) for c in cases)
    if rounds > 1:

        def by_round(index: int) -> Any:
            return lambda c: " / ".join(f"{p50[index]:.1f}" for p50 in c.round_p50_ms)

        per_claim += [
            per_case("prepare p50 of each round, ms", by_round(0)),
            per_case("unprepare p50 of each round, ms", by_round(1)),
        ]
    one, many = in_flights[0], in_flights[-1]

    def p50_ratio(plugin: str, call: str, n: int) -> float:
        return ratio(
            getattr(_case(cases, plugin, n), call).pct(0.5),
            getattr(_case(cases, FLOOR, n), call).pct(0.5),
        )

    prepare_ratio = p50_ratio(OURS, "prepare", one)
    unprepare_ratio = p50_ratio(OURS, "unprepare", one)
    throughput = ratio(
        _case(cases, FLOOR, many).claims_per_second, _case(cases, OURS, many).claims_per_second
    )
    ratios = [
        f"- one at a time, prepare p50 {_fmt_ratio(prepare_ratio)} (target "
        f"<= {TARGET_PREPARE_RATIO:g}x: {_verdict(prepare_ratio, TARGET_PREPARE_RATIO)}), "
        f"unprepare p50 {_fmt_ratio(unprepare_ratio)} (target <= "
        f"{TARGET_UNPREPARE_RATIO:g}x: {_verdict(unprepare_ratio, TARGET_UNPREPARE_RATIO)});",
        f"- {many} in flight, prepare p50 {_fmt_ratio(p50_ratio(OURS, 'prepare', many))}, "
        f"unprepare p50 {_fmt_ratio(p50_ratio(OURS, 'unprepare', many))}; the floor "
        f"completes {_fmt_ratio(throughput)} as many claims per second"
        + (";" if binding_flights else "."),
    ]
    if binding_flights:
        parts = []
        for n in binding_flights:
            value = p50_ratio(OURS_BINDING, "prepare", n)
            where = "one at a time" if n == 1 else f"{n} in flight"
            target = f"target <= {TARGET_BINDING_RATIO:g}x: {_verdict(value, TARGET_BINDING_RATIO)}"
            parts.append(f"{where}, prepare p50 {_fmt_ratio(value)} ({target})")
        ratios.append("- enrolled before binding, " + "; ".join(parts) + ".")
    comparison: list[str] = []
    if baseline:
        spans = []
        for n in in_flights:
            where = "one at a time" if n == 1 else f"with {n} in flight"
            before, ours = _case(cases, BEFORE, n), _case(cases, OURS, n)
            spans.append(
                f"prepare p50 {against(before.prepare.pct(0.5), ours.prepare.pct(0.5))} and "
                f"unprepare p50 {against(before.unprepare.pct(0.5), ours.unprepare.pct(0.5))} "
                f"{where}"
            )
        for n in binding_flights if BEFORE_BINDING in binding_plugins else ():
            where = "one at a time" if n == 1 else f"with {n} in flight"
            before, ours = _case(cases, BEFORE_BINDING, n), _case(cases, OURS_BINDING, n)
            spans.append(
                "enrolled before binding, prepare p50 "
                f"{against(before.prepare.pct(0.5), ours.prepare.pct(0.5))} {where}"
            )
        comparison = ["", "ours against before: " + "; ".join(spans) + "."]

    busy = "plugins alternating." if baseline else "two plugins alternating."
    load = (
        f"The 1-minute load average, sampled every 5 s during the run, had a mean of "
        f"{machine.load_mean:.1f} on these {machine.cpus} CPUs"
        + (
            ": the machine was busy with other work, so the absolute figures are slower "
            "than on an idle machine; the ratios come from the same minutes, the " + busy
            if machine.load_mean > machine.cpus
            else "."
        )
    )
    before_text = ""
    if baseline and baseline.variant:
        before_text = (
            f'"before" is not an earlier daemon but a variant of this one: the tree of commit '
            f'`{baseline.commit}` ("{baseline.subject}") with '
            f"`bench/variants/{baseline.variant}.patch` applied, exported from git and "
            f"started as ours is, with its own directories. {baseline.variant_summary} "
        )
    elif baseline:
        before_text = (
            f'"before" is the daemon of commit `{baseline.commit}` ("{baseline.subject}"), '
            "its tree exported from git and started as ours is, with its own directories. "
        )
    binding_text: list[str] = []
    if binding_flights:
        first = _case(cases, OURS_BINDING, binding_flights[0])
        calls = first.calls // max(1, len(first.round_p50_ms))  # the claims of one round
        flights = " and then ".join(str(n) for n in binding_flights)
        in_rounds = f" ({rounds} rounds each, the order turning)" if rounds > 1 else ""
        runs = (
            f'"{BEFORE_BINDING}" and "{OURS_BINDING}", run last, alternating, with {flights} '
            f"in flight{in_rounds}, are before and ours, each alone and restarted with"
            if BEFORE_BINDING in binding_plugins
            else f'"{OURS_BINDING}", run last with {flights} in flight{in_rounds}, is ours '
            "restarted with"
        )
        binding_text = [
            "",
            f"{runs} "
            f"`--enroll-before-binding` against {calls} claims of its own whose allocation "
            f"names the node and asks for `{ENROLLED}`, as the scheduler allocates them for "
            "enrollment before binding: the daemon enrolls each claim before the timing "
            "starts, so the kubelet's prepare finds it in the daemon's checkpoint and only "
            "checks its files (between a pod's prepare and its unprepare drabench removes "
            "the pod from the claim's `reservedFor`, untimed, as the claim controller does "
            "when a pod ends, so the daemon does not enroll it again); the ratio is against "
            "the floor's prepare with the same number in flight.",
        ]
    plugins = "the plugins" if baseline else "both plugins"
    if rounds > 1:
        names = ", ".join(dict.fromkeys(c.plugin for c in cases if c.plugin not in BINDING_PLUGINS))
        flights_in_turn = " and then ".join(str(n) for n in in_flights)
        order = (
            f"with {flights_in_turn} in flight, {rounds} rounds each, in which every plugin "
            "runs every claim once, the plugins' order turning by one from round to round "
            f"(first round: {names}); a case's figures pool its {rounds} rounds, and the "
            "per-case table gives each round's p50 as well, so a difference that holds in "
            "every round can be told from the machine's drift"
        )
    else:
        order = ", ".join(
            f"{c.plugin} with {c.in_flight} in flight"
            for c in cases
            if c.plugin not in BINDING_PLUGINS
        )
    distant = (
        [
            "",
            f"Every request to the fake Thunder service is answered {thunder_latency_ms} ms "
            "late (a latency fault on every `/api/v1/` path), as a Thunder service across a "
            "network would answer; the daemon's other work is as in the section above. The "
            "floor does not talk to Thunder: this run shows what the daemon's Thunder round "
            "trips cost the kubelet, and what making them at once saves.",
        ]
        if thunder_latency_ms
        else []
    )
    running = (
        [
            "",
            f"Each pod runs {run_ms} ms between its prepare and its unprepare (drabench "
            "`--run-for`, untimed), as a pod's containers run between the kubelet's two "
            "calls. Where a pod is unprepared the moment its prepare answers, the work a "
            "plugin does just after an answer (ours: the `Client` record's status, the "
            "claim's status) overlaps the unprepare; here it is done by then. Claims per "
            "second include the running time.",
        ]
        if run_ms
        else []
    )
    return "\n".join(
        [
            heading(thunder_latency_ms, run_ms, baseline.variant if baseline else ""),
            "",
            f"Command: `{command}` ({machine.started}; {machine.arch}, {machine.cpus} CPUs "
            f"({machine.cpu_model}) shared by the control plane, the fake Thunder service, "
            f"{plugins} and the kubelet's DRA code; Python {machine.python}, "
            f"{machine.go}, Kubernetes {machine.kubernetes} modules).",
            *distant,
            *running,
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
            "a fresh enrollment, every unprepare its revocation). "
            + before_text
            + '"floor" is `floorplugin`, '
            "a DRA plugin on the upstream helper (`k8s.io/dynamic-resource-allocation/"
            "kubeletplugin`) that returns a CDI device ID per device and writes nothing: "
            "the helper reads the claim from the API server, calls are not serialized, its "
            "client has no rate limit. It is the least any driver pays for the protocol "
            "and the kubelet's own work. "
            + ("All three plugins run" if baseline else "Both plugins run")
            + " on the same simulated node "
            "against the same claims, in one run, alternating: "
            + order
            + f'. "{many} in flight": {many} pods at once, each prepared and then '
            "unprepared before the next is taken. A case starts once the daemon of the "
            "case before has finished what it does after its answers (no claim status "
            "entry or `Client` record left): the CPU that takes after drabench's last "
            "answer is added to that daemon's case, not to the next plugin's.",
            *binding_text,
            "",
            *_latency_header(compared),
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
            "prepare plus an unprepare, from /proc/<pid>/stat over the timed calls and, for "
            "a daemon, the work left after its last answer."
            + (REQUESTS_NOTE if counted_requests else ""),
            "",
            "Ratios, ours over floor:",
            "",
            *ratios,
            *comparison,
            "",
            load,
            *(["", note] if note else []),
            "",
        ]
    )


def write_docs(
    section: str,
    path: Path = DOC,
    thunder_latency_ms: int = 0,
    run_ms: int = 0,
    variant: str = "",
) -> None:
    """Replace the "Kubelet calls" section of docs/benchmarks.md (new: after "Daemon"),
    or, for a run with Thunder answering late, pods running or beside a variant of the
    daemon, its own section (new: after that one)."""
    after = HEADING if thunder_latency_ms or run_ms or variant else "## Daemon"
    title = heading(thunder_latency_ms, run_ms, variant)
    replace_section(path, title, section, intro=INTRO, after=after)
