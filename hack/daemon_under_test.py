# The node daemon with test hooks: `thunder-daemon` plus `--crash-at <step>[@n]`, which makes
# it exit 137 right after that step (thunder_dra.plugin.state.crashpoints). Tests only: images ship
# thunder_dra alone, so a production daemon can never be started this way.
#
#   .venv/bin/python -m hack.daemon_under_test [--crash-at prepare:cdi-written] <daemon flags>
"""Start the daemon with a crash point armed (tests only)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from thunder_dra.plugin.__main__ import main
from thunder_dra.plugin.state.crashpoints import CrashPoints


def split_crash_args(argv: Sequence[str]) -> tuple[CrashPoints, list[str]]:
    """The crash point a leading `--crash-at STEP` asks for, and the daemon's own flags."""
    args = list(argv)
    if args[:1] == ["--crash-at"] and len(args) >= 2:
        return CrashPoints.parse(args[1]), args[2:]
    return CrashPoints(), args


def run(argv: Sequence[str] | None = None) -> int:
    try:
        crash, rest = split_crash_args(sys.argv[1:] if argv is None else argv)
    except ValueError as err:
        print(f"thunder-daemon: {err}", file=sys.stderr)
        return 2
    return main(rest, crash=crash)


if __name__ == "__main__":
    sys.exit(run())
