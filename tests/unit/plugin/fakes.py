"""Crash points and a meeting of calls for the daemon's claim lifecycle tests (Kubernetes is
faked by :class:`tests.support.fakekube.FakeKube`, Thunder by :mod:`hack.fake_thunder`).

:class:`CrashAt` is a :class:`CrashPoints` whose crash raises :class:`Crashed` instead of
ending the process: being a ``BaseException``, it passes every ``except Exception`` the
way a SIGKILL skips every handler, so no rollback runs and what was written stays.
:class:`Meeting` shows that steps run at once; :func:`until` waits for what work in the
background does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from thunder_dra.plugin.state.crashpoints import ALL_STEPS, CrashPoints

UNTIL_SECONDS = 5.0


async def until(condition: Callable[[], object], what: str = "the condition") -> None:
    """Return once ``condition()`` is true, checked every 10 ms; fail after
    :data:`UNTIL_SECONDS`, naming ``what``."""
    for _ in range(int(UNTIL_SECONDS / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{what} never came about")


class Crashed(BaseException):
    """The daemon "died" at ``step``."""

    def __init__(self, step: str) -> None:
        super().__init__(step)
        self.step = step


class CrashAt(CrashPoints):
    def __init__(self, step: str, occurrence: int = 1) -> None:
        if step not in ALL_STEPS:
            raise ValueError(f"unknown crash point {step!r}")
        super().__init__(step, occurrence)
        self._target = step
        self._remaining = occurrence
        self.reached_steps: list[str] = []
        self.crashed: Crashed | None = None  # once the daemon "died" here

    def reached(self, step: str) -> None:
        self.reached_steps.append(step)
        if step != self._target:
            return
        self._remaining -= 1
        if self._remaining == 0:
            self.crashed = Crashed(step)
            raise self.crashed


class Recording(CrashPoints):
    """Unarmed; remembers the steps reached, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.reached_steps: list[str] = []

    def reached(self, step: str) -> None:
        self.reached_steps.append(step)


class OnStep(Recording):
    """Runs ``action`` when ``step`` is reached (a fault injected between two steps)."""

    def __init__(self, step: str, action: Callable[[], None]) -> None:
        if step not in ALL_STEPS:
            raise ValueError(f"unknown crash point {step!r}")
        super().__init__()
        self._target = step
        self._action = action

    def reached(self, step: str) -> None:
        super().reached(step)
        if step == self._target:
            self._action()


Call = Callable[..., Coroutine[Any, Any, Any]]


class Meeting:
    """Wraps calls so that each waits until ``everyone`` of them have started: calls made
    one after another would never get past the first."""

    def __init__(self, everyone: int) -> None:
        self.everyone = everyone
        self.started: list[str] = []
        self._all_started = asyncio.Event()

    def wrap(self, name: str, call: Call) -> Call:
        async def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.started.append(name)
            if len(self.started) == self.everyone:
                self._all_started.set()
            await asyncio.wait_for(self._all_started.wait(), timeout=5)
            return await call(*args, **kwargs)

        return wrapped
