"""The CPU a checkpoint write costs as a node holds more prepared claims.

Every prepare commits the checkpoint once and every unprepare twice (marked, then
dropped), and each write is the whole file: every prepared claim of the node. This
benchmark times the encoding of such a write (what runs in the writer thread while
holding the interpreter lock; the atomic write and its fsyncs come after) with N claims
prepared, one claim changed per write, two ways side by side in one run, alternating:

- "whole": every claim encoded again, as ``encode_checkpoint(checkpoint)`` does alone;
- "reused": the store's :class:`thunder_dra.plugin.state.checkpoint.EncodedClaims`,
  which encodes only the claims that changed since the previous write.

Both give the same bytes (tests/unit/plugin/test_plugin_checkpoint.py checks it on
generated sequences); the benchmark checks it again on every write it times.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime

from bench.docsection import DOC, INTRO, command_line, replace_section
from thunder_dra.plugin.state import checkpoint as ck

HEADING = "## Checkpoint writes"
AFTER = "## Kubelet calls, Thunder 20 ms away"


def _claim(uid: str, generation: int) -> ck.PreparedClaim:
    """A pod's claim as prepare commits it (two devices, files, IDs)."""
    return ck.PreparedClaim(
        uid=uid,
        namespace="team-a",
        name=f"train-{uid[:8]}",
        consumer=ck.Consumer(kind="pod", name=f"train-{uid[:8]}-pod"),
        zone_name="us-east",
        zone_id="zone-3c1f0a7e",
        gpu_type="A6000",
        gpu_count=2,
        enrollment_token_id=f"etok-{uid}-{generation}",
        client_id=f"client-{uid}-{generation}",
        devices=tuple(
            ck.PreparedDevice(
                pool_name="us-east-a6000",
                device_name=f"a6000-{i}",
                request_names=("gpu",),
                cdi_device_ids=(f"thundercompute.com/gpu=claim-{uid}",),
            )
            for i in range(2)
        ),
        paths=(
            f"/var/lib/kubelet/plugins/thundercompute.com/claims/{uid}",
            f"/var/run/cdi/thundercompute.com-claim-{uid}.json",
            "/var/lib/kubelet/plugins/thundercompute.com/lib/9f2c/libthunder.so",
        ),
        state=ck.ClaimState.PREPARED,
    )


def _uid(i: int) -> str:
    return f"{i:08x}-5b1e-4c2a-9d3f-{i:012x}"


def _time_writes(
    claims: int, writes: int, encode: Callable[[ck.Checkpoint], bytes]
) -> tuple[list[float], int]:
    """Per-write encoding times (ms), each write after one claim changed; the last
    file's size."""
    checkpoint = ck.Checkpoint()
    for i in range(claims):
        checkpoint = checkpoint.with_claim(_claim(_uid(i), 0))
    content = encode(checkpoint)  # the first write of a store encodes every claim
    times: list[float] = []
    for n in range(writes):
        checkpoint = checkpoint.with_claim(_claim(_uid(n % claims), n + 1))
        started = time.perf_counter()
        content = encode(checkpoint)
        times.append((time.perf_counter() - started) * 1000)
        if content != ck.encode_checkpoint(checkpoint):
            raise SystemExit("the reused encoding differs from the whole one")
    return times, len(content)


def run(sizes: list[int], writes: int, rounds: int) -> list[tuple[int, int, float, float]]:
    """(claims, file bytes, whole p50 ms, reused p50 ms) per size; the rounds alternate."""
    rows = []
    for claims in sizes:
        whole: list[float] = []
        reused: list[float] = []
        size = 0
        for _ in range(rounds):
            times, size = _time_writes(claims, writes, ck.encode_checkpoint)
            whole += times
            encoded = ck.EncodedClaims()

            def with_reuse(checkpoint: ck.Checkpoint, encoded: ck.EncodedClaims = encoded) -> bytes:
                return ck.encode_checkpoint(checkpoint, encoded)

            times, _ = _time_writes(claims, writes, with_reuse)
            reused += times
        rows.append((claims, size, statistics.median(whole), statistics.median(reused)))
    return rows


def section(args: argparse.Namespace, rows: list[tuple[int, int, float, float]]) -> str:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = command_line("bench.checkpoint_write", args, ["writes", "rounds"])
    lines = [
        HEADING,
        "",
        f"Command: `{command} --write-docs` ({when}; {platform.machine()}, "
        f"Python {platform.python_version()}).",
        "",
        "A checkpoint write holds every prepared claim of the node; each prepare makes one "
        "and each unprepare two. The table is the time of encoding one write, all of it CPU "
        "(in the writer thread, holding the interpreter lock, before the atomic write and "
        "its fsyncs), one claim changed since the previous write, p50 over "
        f"{args.writes} writes times {args.rounds} rounds, the two ways alternating in one "
        'run: "whole" encodes every claim again; "reused" is the store\'s '
        "`EncodedClaims`, which encodes only the changed claim. Both give the same bytes "
        "(checked on every write).",
        "",
        "| prepared claims | file KiB | whole p50 ms | reused p50 ms | whole / reused |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for claims, size, whole, reused in rows:
        lines.append(
            f"| {claims} | {size / 1024:.1f} | {whole:.3f} | {reused:.3f} | {whole / reused:.1f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.checkpoint_write", description=__doc__)
    parser.add_argument("--writes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    rows = run([10, 100, 300, 1000], args.writes, args.rounds)
    text = section(args, rows)
    print(text)
    if args.write_docs:
        replace_section(DOC, HEADING, text, intro=INTRO, after=AFTER)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
