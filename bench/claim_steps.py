"""Where a claim's time goes inside the daemon, read from the daemon's own traces.

    python -m bench.claim_steps [--claims 100] [--in-flight 20] [--write-docs]

The set-up of the Daemon section (bench/daemon_prepare.py: the local control plane, the
fake Thunder service, one simulated client-only node, claims allocated up front), with
the daemon exporting its traces over OTLP to a receiver (hack/otlp_receiver.py). After two
warm-up claims (library, zone and pool caches, connections), ``--claims`` claims are each
prepared and then unprepared through the DRA socket one at a time, then as many other
claims ``--in-flight`` at a time. Once the daemon has finished the work it does after its
answers, it is stopped (its last spans are sent then) and every call's trace is read:

- the call: the server span of NodePrepareResources or NodeUnprepareResources;
- each step beneath the claim's span (a Thunder request, a Kubernetes request, a file,
  journal or checkpoint write), in the call's wait or after the answer, with when it
  started after the call did and how long it took;
- the daemon's own time in the wait: the call's span less the time covered by any step
  (the claim's locks, thread hand-offs, Python, waiting for the event loop).

Exporting spans costs the daemon some CPU of its own (a batch thread), so these are not
the latencies of the other sections; they show the order and the share of each step.
``--write-docs`` replaces the "Where a claim's time goes" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bench.daemon_prepare import Claim, Driver, Environment, cycles
from bench.docsection import DOC, INTRO, command_line, replace_section
from bench.kubelet_calls import Leftovers, load_sampler
from bench.kubelet_report import Machine
from hack.otlp_receiver import OtlpReceiver, ReceivedSpan

HEADING = "## Where a claim's time goes"
WARMUP = 2
CALLS = {
    "DRAPlugin/NodePrepareResources": "prepare",
    "DRAPlugin/NodeUnprepareResources": "unprepare",
}
CLAIM_SPANS = ("thunder_dra.prepare", "thunder_dra.unprepare")
_TRACING = {
    "OTEL_TRACES_EXPORTER": "otlp",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
    # Sent every 200 ms, in batches big enough for 20 calls in flight.
    "OTEL_BSP_SCHEDULE_DELAY": "200",
    "OTEL_BSP_MAX_QUEUE_SIZE": "65536",
}


@dataclass(frozen=True)
class Step:
    """One span beneath a claim's span, relative to its call's start, in ms."""

    name: str
    start: float
    duration: float
    after_answer: bool


@dataclass(frozen=True)
class Call:
    kind: str  # "prepare" or "unprepare"
    claim_uid: str
    duration: float
    steps: tuple[Step, ...]

    def own_time(self) -> float:
        """The call's time covered by none of the steps in its wait."""
        covered = 0.0
        reach = 0.0
        for start, end in sorted(
            (s.start, s.start + s.duration) for s in self.steps if not s.after_answer
        ):
            start, end = max(start, reach, 0.0), min(end, self.duration)
            if end > start:
                covered += end - start
                reach = end
        return self.duration - covered


def short_name(name: str) -> str:
    """A step's span name for the table: Kubernetes templates without the group, version
    and namespace placeholder (``GET kube:.../resourceclaims/{name}``)."""
    method, _, target = name.partition(" ")
    if not target.startswith("kube:"):
        return name
    parts = target.removeprefix("kube:").split("/")
    if "{namespace}" in parts:
        rest = parts[parts.index("{namespace}") + 1 :]
    else:
        rest = parts[4:] if parts[1:2] == ["apis"] else parts[3:]
    return f"{method} kube:.../{'/'.join(rest)}"


def calls_of(spans: Iterable[ReceivedSpan], uids: set[str]) -> list[Call]:
    """The prepare and unprepare calls of the claims ``uids``, one claim per call."""
    by_trace: dict[str, list[ReceivedSpan]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span)
    calls: list[Call] = []
    for trace in by_trace.values():
        roots = [s for s in trace if s.parent_id is None and s.name in CALLS]
        claims = [s for s in trace if s.name in CLAIM_SPANS]
        if len(roots) != 1 or len(claims) != 1:
            continue
        [root], [claim] = roots, claims
        uid = str(claim.attributes.get("k8s.resourceclaim.uid", ""))
        if uid not in uids:
            continue
        # A name that recurs in the same part of the call is numbered: (2), (3), ...
        seen: dict[tuple[bool, str], int] = defaultdict(int)
        steps: list[Step] = []
        for span in sorted(trace, key=lambda s: s.start_ns):
            if span is root or span is claim:
                continue
            name = short_name(span.name)
            after_answer = span.start_ns >= root.end_ns
            seen[after_answer, name] += 1
            if seen[after_answer, name] > 1:
                name = f"{name} ({seen[after_answer, name]})"
            steps.append(
                Step(
                    name=name,
                    start=(span.start_ns - root.start_ns) / 1e6,
                    duration=(span.end_ns - span.start_ns) / 1e6,
                    after_answer=after_answer,
                )
            )
        duration = (root.end_ns - root.start_ns) / 1e6
        calls.append(Call(CALLS[root.name], uid, duration, tuple(steps)))
    return calls


def every_call_of(uids: set[str]) -> Callable[[list[ReceivedSpan]], bool]:
    """Whether the spans hold the traces of every claim's prepare and unprepare."""
    return lambda spans: len(calls_of(spans, uids)) >= 2 * len(uids)


def _p50(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def table(calls: Sequence[Call]) -> list[str]:
    """One call kind's rows: the call, each step in the order it starts, the own time."""
    steps: dict[tuple[bool, str], list[Step]] = defaultdict(list)
    for call in calls:
        for step in call.steps:
            steps[step.after_answer, step.name].append(step)
    durations = [c.duration for c in calls]
    own = [c.own_time() for c in calls]
    rows = [
        "| step | when | in calls | starts at, p50 ms | p50 ms | mean ms |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
        f"| the call (server span) | | {len(calls)} | 0.0 | {_p50(durations):.2f} | "
        f"{_mean(durations):.2f} |",
    ]
    # In the wait first, then after the answer; each part in the order its steps start.
    for (after_answer, name), found in sorted(
        steps.items(), key=lambda item: (item[0][0], _p50([s.start for s in item[1]]))
    ):
        when = "after the answer" if after_answer else "in the wait"
        rows.append(
            f"| `{name}` | {when} | {len(found)} | {_p50([s.start for s in found]):.1f} | "
            f"{_p50([s.duration for s in found]):.2f} | {_mean([s.duration for s in found]):.2f} |"
        )
    rows.append(
        f"| the daemon's own time in the wait (no step) | in the wait | {len(calls)} | | "
        f"{_p50(own):.2f} | {_mean(own):.2f} |"
    )
    return rows


def render(runs: Mapping[int, Sequence[Call]], command: str, machine: Machine, claims: int) -> str:
    """The section: for each number in flight, a table of prepare and one of unprepare."""
    in_flights = " and then ".join(f"{n} at a time" for n in sorted(runs))
    lines = [
        HEADING,
        "",
        f"Command: `{command}` ({machine.started}; {machine.arch}, {machine.cpus} CPUs "
        f"({machine.cpu_model}) shared by the control plane, the fake Thunder service, the "
        f"daemon and the OTLP receiver; Python {machine.python}, Kubernetes "
        f"{machine.kubernetes} control plane).",
        "",
        "Each prepare and unprepare of the Daemon section's set-up, taken apart from the "
        "daemon's own traces (exported over OTLP to a receiver, `hack/otlp_receiver.py`): "
        f"{claims} claims {in_flights}, each prepared and then unprepared through the DRA "
        "socket. A step is a span beneath the claim's span (a Thunder or Kubernetes "
        'request, a journal, file or checkpoint write), "in the wait" when it starts before '
        'the call answers; "starts at" is its start after the call\'s; "in calls" counts '
        "the calls that made it. Steps that overlap run at once. The daemon's own time is "
        "the call's time that no step in the wait covers: the locks, the thread hand-offs, "
        "Python and the event loop, and the wait for a checkpoint write that another call "
        "made: one write carries every change made before it started, and its span is in "
        "the trace of the call that made it (so a step can be in fewer calls than the "
        "table's). The work after the answer waits for the calls to pause, which here "
        "happens when a run's last call is answered: it then goes all at once, so its "
        "durations include waiting behind the rest. Exporting spans costs the daemon a "
        "little CPU of its own, so the other sections' latencies are the ones to compare; "
        "this one shows the order and the share of each step.",
        "",
    ]
    for in_flight, calls in sorted(runs.items()):
        for kind in ("prepare", "unprepare"):
            of_kind = [c for c in calls if c.kind == kind]
            lines += [f"{kind.capitalize()}, {in_flight} in flight:", "", *table(of_kind), ""]
    lines.append(
        f"The 1-minute load average, sampled every 5 s during the run, had a mean of "
        f"{machine.load_mean:.1f} on these {machine.cpus} CPUs."
    )
    return "\n".join(lines) + "\n"


async def drive(env: Environment, claims: list[Claim], in_flight: int) -> None:
    driver = Driver(env.socket)
    try:
        await cycles(driver, claims, in_flight)
    finally:
        await driver.channel.close(None)


def run(claims: int, in_flights: Sequence[int], workdir: Path) -> dict[int, list[Call]]:
    """The calls of each number in flight, each over ``claims`` claims of its own."""
    with (
        OtlpReceiver() as receiver,
        Environment(WARMUP + claims * len(in_flights), workdir) as env,
    ):
        env.prepare_cluster()
        daemon = env.spawn_daemon(
            env.root,
            environment={**_TRACING, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint},
        )
        env.daemon = daemon
        leftovers = Leftovers(env, env.claims)
        phases: dict[int, list[Claim]] = {}
        try:
            asyncio.run(drive(env, env.claims[:WARMUP], 1))
            for index, in_flight in enumerate(in_flights):
                start = WARMUP + index * claims
                phases[in_flight] = env.claims[start : start + claims]
                # A phase starts once the work after the last one's answers is done.
                leftovers.wait_none(f"the run before {in_flight} in flight")
                asyncio.run(drive(env, phases[in_flight], in_flight))
            leftovers.wait_none("the last run")
        finally:
            leftovers.close()
        env.stop_daemon(daemon)  # sends what is still waiting in its batch
        runs: dict[int, list[Call]] = {}
        for in_flight, timed in phases.items():
            uids = {c.uid for c in timed}
            spans = receiver.wait_for(every_call_of(uids), timeout=60)
            runs[in_flight] = calls_of(spans, uids)
        return runs


def write_docs(section: str) -> None:
    replace_section(DOC, HEADING, section, intro=INTRO, after="## Kubernetes requests of a claim")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.claim_steps", description=__doc__)
    parser.add_argument("--claims", type=int, default=100, help="claims timed")
    parser.add_argument("--in-flight", type=int, default=20)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    if not 1 <= args.claims <= 2000:
        parser.error("--claims must be within 1-2000")
    if not 1 <= args.in_flight <= 100:
        parser.error("--in-flight must be within 1-100")
    started = datetime.now(UTC)
    with load_sampler() as load, tempfile.TemporaryDirectory(prefix="bench-steps-") as workdir:
        runs = run(args.claims, sorted({1, args.in_flight}), Path(workdir))
    machine = Machine.describe(started, sum(load) / len(load))
    command = command_line("bench.claim_steps", args, ["claims", "in_flight"]) + " --write-docs"
    section = render(runs, command, machine, args.claims)
    print(section)
    if args.write_docs:
        write_docs(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
