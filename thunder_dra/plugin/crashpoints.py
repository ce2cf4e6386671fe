"""A test hook: make the daemon die at a named step, as a SIGKILL or power loss would.

``THUNDER_DRA_CRASH_AT=<step>`` makes the process call ``os._exit(137)`` right after
that step's durable effect (a journal write, a Thunder call, a file, a Kubernetes
write), so the crash-safety tests can stop the daemon at every step of prepare and
unprepare and check that a restart converges without leaking an enrollment.

Inert unless the variable is set: :meth:`CrashPoints.reached` is then a dictionary
miss. A step name the daemon does not know is refused at start-up, so a typo in a test
cannot silently disarm it. ``<step>@<n>`` crashes on the n-th time the step is reached.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

CRASH_ENV = "THUNDER_DRA_CRASH_AT"
CRASH_EXIT_CODE = 137

PREPARE_STEPS = (
    "prepare:journal-begun",
    "prepare:token-recorded",
    "prepare:exchanged",
    "prepare:client-id-recorded",
    "prepare:config-written",
    "prepare:secret-written",
    "prepare:client-recorded",
    "prepare:cdi-written",
    "prepare:checkpoint-committed",
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
    def from_env(cls, env: Mapping[str, str]) -> CrashPoints:
        spec = env.get(CRASH_ENV, "").strip()
        if not spec:
            return cls()
        step, _, count = spec.partition("@")
        if step not in ALL_STEPS:
            raise ValueError(f"{CRASH_ENV}={spec!r}: unknown step; known: {sorted(ALL_STEPS)}")
        if count and (not count.isdigit() or int(count) < 1):
            raise ValueError(f"{CRASH_ENV}={spec!r}: the occurrence after @ must be >= 1")
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
