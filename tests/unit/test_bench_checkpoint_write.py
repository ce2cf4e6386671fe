"""bench.checkpoint_write on a few small checkpoints: both ways timed, the section written."""

from __future__ import annotations

import argparse

from bench import checkpoint_write


def test_both_ways_are_timed_and_tabled() -> None:
    rows = checkpoint_write.run([3, 7], writes=4, rounds=2)
    assert [row[0] for row in rows] == [3, 7]
    assert all(size > 0 and whole > 0 and reused > 0 for _, size, whole, reused in rows)
    args = argparse.Namespace(writes=4, rounds=2)
    text = checkpoint_write.section(args, rows)
    assert text.startswith("## Checkpoint writes\n")
    assert "`python -m bench.checkpoint_write --writes 4 --rounds 2 --write-docs`" in text
    assert text.count("\n| 3 |") == 1
    assert text.count("\n| 7 |") == 1
