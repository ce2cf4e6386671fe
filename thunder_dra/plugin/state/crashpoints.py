"""A test hook: make the daemon die at a named step, as a SIGKILL or power loss would.

An armed :class:`CrashPoints` makes the process call ``os._exit(137)`` right after a
step's durable effect (a journal write, a Thunder call, a file, a Kubernetes write), so
the crash-safety tests can stop the daemon at every step of prepare and unprepare and
check that a restart converges without leaking an enrollment.

Only the test-only entry point ``python -m hack.daemon_under_test --crash-at <step>``
arms one; the production entry point (``thunder-daemon``) never does, and nothing is
read from the environment, so no ThunderCluster (``extraEnv``), chart value or variable
can switch it on, and the images (which ship ``thunder_dra`` only) cannot run it at all.
A step name the daemon does not know is refused, so a typo in a test cannot silently
disarm it. ``<step>@<n>`` crashes on the n-th time the step is reached.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Awaitable

CRASH_EXIT_CODE = 137

Step = tuple[Awaitable[object], str]
"""A step of work, and the crash point reached once it is done."""

PREPARE_STEPS = (
    "prepare:journal-begun",
    "prepare:token-recorded",
    "prepare:exchanged",
    "prepare:client-id-recorded",
    "prepare:config-written",
    "prepare:secret-written",
    "prepare:cdi-written",
    "prepare:checkpoint-committed",
    "prepare:client-recorded",
    "prepare:journal-closed",
)
UNPREPARE_STEPS = (
    "unprepare:marked",
    "unprepare:token-revoked",
    "unprepare:client-revoked",
    "unprepare:cdi-removed",
    "unprepare:claim-dir-removed",
    "unprepare:secret-removed",
    "unprepare:client-removed",
    "unprepare:checkpoint-dropped",
)
ENROLL_STEPS = (
    "enroll:journal-begun",
    "enroll:token-recorded",
    "enroll:installed",
    "enroll:state-saved",
)
ALL_STEPS = frozenset(PREPARE_STEPS + UNPREPARE_STEPS + ENROLL_STEPS)

log = logging.getLogger(__name__)


class CrashPoints:
    def __init__(self, step: str | None = None, occurrence: int = 1) -> None:
        self._step = step
        self._left = occurrence

    @classmethod
    def parse(cls, spec: str) -> CrashPoints:
        """``<step>`` or ``<step>@<n>``; raises ValueError naming the problem."""
        spec = spec.strip()
        step, _, count = spec.partition("@")
        if step not in ALL_STEPS:
            raise ValueError(f"crash point {spec!r}: unknown step; known: {sorted(ALL_STEPS)}")
        if count and (not count.isdigit() or int(count) < 1):
            raise ValueError(f"crash point {spec!r}: the occurrence after @ must be >= 1")
        log.warning("test crash hook armed", extra={"crash_at": step, "occurrence": count or "1"})
        return cls(step, int(count or 1))

    @property
    def armed(self) -> bool:
        return self._step is not None

    def reached(self, step: str) -> None:
        if step != self._step:
            return
        self._left -= 1
        if self._left > 0:
            return
        sys.stderr.write(f"thunder-daemon: crash hook: exiting at {step}\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)

    async def together(self, *steps: Step) -> None:
        """Run ``steps`` at once and wait for all of them (a step is never abandoned
        half-way because another failed); then reach the crash points of those that
        succeeded, in the order given, and raise the first error in that order."""
        outcomes = await asyncio.gather(*(work for work, _ in steps), return_exceptions=True)
        for outcome, (_, point) in zip(outcomes, steps, strict=True):
            if not isinstance(outcome, BaseException):
                self.reached(point)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
