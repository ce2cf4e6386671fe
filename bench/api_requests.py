"""Benchmark of what a claim's Kubernetes requests cost the control plane: kube-apiserver
and etcd CPU per request, request by request, on the local control plane.

    python -m bench.api_requests [--claims 150] [--rounds 2] [--write-docs]

Set-up as in bench.daemon_prepare (control plane, a node, its pool's ResourceSlice, and
ResourceClaims allocated and reserved for a bare pod each), without a daemon process:
the benchmark makes the daemon's own requests through the daemon's own code
(:class:`~thunder_dra.kube.client.KubeClient`, :class:`~thunder_dra.plugin.claims.records.Records`,
:class:`~thunder_dra.plugin.claims.status.ClaimStatusWriter`), in the order of a claim's
life, one step at a time over every claim with one request in flight, and reads the CPU
time of kube-apiserver and etcd from /proc/<pid>/stat around each step. Nothing else runs
against the control plane meanwhile, so the CPU of a step is that of its requests (and of
the control plane's own background work over those seconds, which the rounds show).
``--write-docs`` replaces the "Kubernetes requests of a claim" section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry

from bench.daemon_prepare import API_TOKEN, DRIVER, Claim, Environment, cpu_ms_per, cpu_seconds
from bench.docsection import DOC, INTRO, command_line, machine, replace_section
from thunder_dra.api import CLIENT_FINALIZER
from thunder_dra.kube import provenance
from thunder_dra.kube.events import EventRecorder
from thunder_dra.kube.transport import build_client
from thunder_dra.plugin.claims.records import Records, client_name
from thunder_dra.plugin.claims.status import (
    UNPREPARED,
    ClaimStatusWriter,
    ClaimTarget,
    prepared_outcome,
)
from thunder_dra.plugin.state.checkpoint import (
    ClaimState,
    Consumer,
    PreparedClaim,
    PreparedDevice,
)
from thunder_dra.thunder.redact import Secret

HEADING = "## Kubernetes requests of a claim"
AFTER = "## Kubelet calls, Thunder 20 ms away"
WATCHED = ("kube-apiserver", "etcd")


@dataclass(frozen=True)
class Step:
    label: str
    when: str
    requests: int
    """Requests the step makes per claim."""


STEPS: tuple[Step, ...] = (
    Step("claim GET", "prepare, in the kubelet's wait", 1),
    Step("`Client` create", "prepare, in the kubelet's wait", 1),
    Step("`Client` status `Enrolled` (JSON patch)", "after the prepare's answer", 1),
    Step("claim status apply, the claim's entries", "after the prepare's answer", 1),
    Step("claim status apply, no entries", "after the unprepare's answer", 1),
    Step("`Client` finalizer removed, then the record deleted", "after the unprepare's answer", 2),
)
RECREATE = Step("`Client` create, again", "before each row below", 1)
ORDERS: tuple[Step, ...] = (
    Step("`Client` finalizer removed, then deleted", "the daemon's order", 2),
    Step("`Client` deleted, then its finalizer removed", "the other order", 2),
)
"""Beside the claim's life, not in its sum: the two orders of a record's removal, each
after the records are made again (:data:`RECREATE`, not shown), in the same run; which
goes first turns from round to round."""


@dataclass(frozen=True)
class Figure:
    """One step over every claim of one round: CPU and wall time per claim, in ms."""

    step: Step
    round: int
    cpu_ms: dict[str, float]
    wall_ms: float


def prepared_claim(claim: Claim, pool: str, device: str, zone: str) -> PreparedClaim:
    """The checkpoint entry a prepare of ``claim`` would commit (IDs made up)."""
    return PreparedClaim(
        uid=claim.uid,
        namespace=claim.namespace,
        name=claim.name,
        consumer=Consumer(kind="pod", name=claim.pod),
        zone_name=zone,
        zone_id="zone-id-bench",
        gpu_type="A6000",
        gpu_count=1,
        devices=(
            PreparedDevice(
                pool_name=pool,
                device_name=device,
                request_names=("gpu",),
                cdi_device_ids=(f"{DRIVER}/gpu=claim-{claim.uid}",),
            ),
        ),
        enrollment_token_id=f"tok-{claim.uid[:8]}",
        client_id=f"client-{claim.uid[:8]}",
        state=ClaimState.PREPARED,
    )


async def measure(env: Environment, rounds: int) -> list[Figure]:
    assert env.cluster is not None
    pids = {name: env.cluster.pids[name] for name in WATCHED}
    kube = build_client(env.cluster.kubeconfig, user_agent="bench-api-requests")
    await kube.open()
    try:
        events = EventRecorder(kube, component="bench", instance=env.node, scrub=str)
        records = Records(
            kube, env.node, provenance.ProvenanceKey(Secret(API_TOKEN)), events=events
        )
        writer = ClaimStatusWriter(kube, driver=DRIVER, scrub=str, registry=CollectorRegistry())
        claims = env.claims
        prepared = [
            prepared_claim(c, env.pool_name, env.devices[i % len(env.devices)], env.zone)
            for i, c in enumerate(claims)
        ]
        read: dict[str, dict[str, object]] = {}

        async def get(i: int) -> None:
            read[claims[i].uid] = await kube.get_claim(claims[i].namespace, claims[i].name)

        def target(i: int) -> ClaimTarget:
            return ClaimTarget(claims[i].namespace, claims[i].name, claims[i].uid)

        work: dict[str, Callable[[int], Awaitable[object]]] = {
            STEPS[0].label: get,
            STEPS[1].label: lambda i: records.write_client(prepared[i]),
            STEPS[2].label: lambda i: records.mark_enrolled(prepared[i]),
            STEPS[3].label: lambda i: writer.write(
                target(i), prepared_outcome(prepared[i]), read[claims[i].uid]
            ),
            STEPS[4].label: lambda i: writer.write(target(i), UNPREPARED),
            STEPS[5].label: lambda i: records.delete_client(claims[i].namespace, claims[i].uid),
            RECREATE.label: lambda i: records.write_client(prepared[i]),
            ORDERS[0].label: lambda i: records.delete_client(claims[i].namespace, claims[i].uid),
            ORDERS[1].label: lambda i: delete_first(claims[i]),
        }

        async def delete_first(claim: Claim) -> None:
            name = client_name(claim.uid)
            await kube.delete_client(claim.namespace, name)
            await kube.json_patch_client(
                claim.namespace,
                name,
                [
                    {"op": "test", "path": "/metadata/finalizers/0", "value": CLIENT_FINALIZER},
                    {"op": "remove", "path": "/metadata/finalizers/0"},
                ],
            )

        async def timed(step: Step, number: int) -> Figure:
            before = cpu_seconds(pids)
            started = time.perf_counter()
            for index in range(len(claims)):
                await work[step.label](index)
            wall = time.perf_counter() - started
            cpu = cpu_ms_per(pids, before, len(claims))
            print(f"round {number}: {step.label} done", file=sys.stderr)
            return Figure(step, number, cpu, wall * 1000 / len(claims))

        figures = []
        for number in range(1, rounds + 1):
            for step in STEPS:
                figures.append(await timed(step, number))
            for order in ORDERS if number % 2 else reversed(ORDERS):
                await timed(RECREATE, number)
                figures.append(await timed(order, number))
        return figures
    finally:
        await kube.close()


def render(figures: Sequence[Figure], claims: int, command: str, started: str, machine: str) -> str:
    rounds = sorted({f.round for f in figures})
    by = {(f.step.label, f.round): f for f in figures}
    header = " | ".join(f"round {r}" for r in rounds)
    totals = {r: {name: 0.0 for name in WATCHED} for r in rounds}

    def row(step: Step) -> str:
        cells = []
        for r in rounds:
            figure = by[(step.label, r)]
            cells.append(
                f"{figure.cpu_ms['kube-apiserver']:.1f} / {figure.cpu_ms['etcd']:.1f} "
                f"/ {figure.wall_ms:.1f}"
            )
        return f"| {step.label} | {step.when} | {step.requests} | " + " | ".join(cells) + " |"

    rows = [row(step) for step in STEPS]
    for step in STEPS:
        for r in rounds:
            for name in WATCHED:
                totals[r][name] += by[(step.label, r)].cpu_ms[name]
    total_cells = " | ".join(
        f"{totals[r]['kube-apiserver']:.1f} / {totals[r]['etcd']:.1f} / -" for r in rounds
    )
    requests = sum(s.requests for s in STEPS)
    apiserver = [totals[r]["kube-apiserver"] for r in rounds]
    # Per write request (a step's CPU over its requests), every round.
    writes = [
        by[(step.label, r)].cpu_ms["kube-apiserver"] / step.requests
        for step in STEPS
        if step is not STEPS[0]
        for r in rounds
    ]
    return "\n".join(
        [
            HEADING,
            "",
            f"Command: `{command}` ({started}; {machine}; the local control plane as in the "
            "sections above).",
            "",
            f"What the daemon's own Kubernetes requests cost the control plane, for {claims} "
            "claims: the benchmark makes them through the daemon's code (its API client, "
            "`Records` and the claim status writer), step by step in the order of a claim's "
            "life, one request in flight, and reads the CPU time of kube-apiserver and etcd "
            "from /proc before and after each step; nothing else uses the control plane "
            "meanwhile. Each cell is kube-apiserver CPU / etcd CPU / wall time, in ms per "
            "claim. A claim enrolled before binding makes the same requests (the kubelet's "
            "later prepare makes none of the claim status's), and the kubelet's own claim "
            "read comes on top.",
            "",
            f"| request | when | requests per claim | {header} |",
            "| --- | --- | ---: |" + " ---: |" * len(rounds),
            *rows,
            f"| all of a claim's | | {requests} | {total_cells} |",
            *(row(step) for step in ORDERS),
            "",
            f"A claim's {requests} requests cost the API server "
            + " and ".join(f"{v:.1f}" for v in apiserver)
            + f" ms of CPU in the rounds above; each write request {min(writes):.1f} to "
            f"{max(writes):.1f} ms, whatever its kind (create, JSON patch, server-side apply, "
            "delete), against "
            + " and ".join(
                f"{by[(STEPS[0].label, r)].cpu_ms['kube-apiserver']:.1f}" for r in rounds
            )
            + " ms for the claim read. So the API server's share of a claim's cost follows "
            "the number of writes; the kubelet-call sections' kube-apiserver figures are "
            "these requests plus the kubelet's own claim read, on a machine as busy as "
            "that run's.",
            "",
            "The last two rows, not in the sum, remove each record (made again just before) "
            "in either order, the first of them turning from round to round: the daemon's, "
            "which drops its finalizer and then deletes the record, gone at once; and the "
            "other, a delete that marks the record Terminating and then the patch that drops "
            "the finalizer and so deletes it. The daemon's order costs the API server "
            + _per_round(by, ORDERS[0], "kube-apiserver", rounds)
            + " ms and etcd "
            + _per_round(by, ORDERS[0], "etcd", rounds)
            + " ms, against "
            + _per_round(by, ORDERS[1], "kube-apiserver", rounds)
            + " ms and etcd "
            + _per_round(by, ORDERS[1], "etcd", rounds)
            + " ms the other way.",
            "",
        ]
    )


def _per_round(by: dict[tuple[str, int], Figure], step: Step, name: str, rounds: list[int]) -> str:
    return " and ".join(f"{by[(step.label, r)].cpu_ms[name]:.1f}" for r in rounds)


def write_docs(section: str, path: Path = DOC) -> None:
    replace_section(path, HEADING, section, intro=INTRO, after=AFTER)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.api_requests")
    parser.add_argument("--claims", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    if args.claims < 1 or args.rounds < 1:
        parser.error("--claims and --rounds must be at least 1")
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    with (
        tempfile.TemporaryDirectory(prefix="bench-api-") as workdir,
        Environment(args.claims, Path(workdir)) as env,
    ):
        env.prepare_cluster()
        figures = asyncio.run(measure(env, args.rounds))
    command = command_line("bench.api_requests", args, ["claims", "rounds"]) + (
        " --write-docs" if args.write_docs else ""
    )
    section = render(figures, args.claims, command, started, machine())
    print(section)
    if args.write_docs:
        write_docs(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
