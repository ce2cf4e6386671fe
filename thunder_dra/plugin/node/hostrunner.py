"""One way to run commands on the host: ``nsenter`` in a cluster, a plain process in tests.

Every host command of the daemon (``thunder status --json``, the installer, ``nvidia-smi``)
goes through a :class:`HostRunner`, so tests substitute scripts for the host's tools
by putting a fake ``bin`` directory first on the ``PATH`` of a :class:`LocalRunner`.

Each command runs in a new session (its own process group); on timeout or cancellation
the whole group is killed, so an installer's children do not outlive it. Secrets are
passed in ``env`` (never in the command text, which shows in ``ps`` on the host), and
logs show the program name and the environment with sensitive values redacted, never
the arguments or the output.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import re
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

DEFAULT_TIMEOUT = 60.0
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
REDACTED = "<redacted>"
_SENSITIVE_ENV = re.compile(r"TOKEN|SECRET|PASSWORD|CREDENTIAL|KEY", re.IGNORECASE)
_REAP_TIMEOUT = 5.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class HostCommandError(Exception):
    """A host command could not be run to completion."""


class HostCommandTimeout(HostCommandError):
    def __init__(self, program: str, timeout: float) -> None:
        super().__init__(f"host command {program} did not finish within {timeout:g}s; killed")
        self.program = program
        self.timeout = timeout


class HostRunner(Protocol):
    async def run(
        self,
        command: Sequence[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        # A parameter rather than the caller's asyncio.timeout: expiry must kill the
        # command's process group and say which command it was.
        timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109
        input: bytes | str | None = None,
    ) -> CommandResult:
        """Run ``command`` (an argv list, or a string for ``/bin/sh -c``) to completion.

        A non-zero exit is returned, not raised; a timeout raises
        :class:`HostCommandTimeout` after the process group was killed.
        """
        ...


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the values of token/secret/password/credential/key variables hidden."""
    return {k: (REDACTED if _SENSITIVE_ENV.search(k) else v) for k, v in env.items()}


def _program_name(argv: Sequence[str]) -> str:
    return os.path.basename(argv[0]) if argv else ""


class _ProcessRunner(abc.ABC):
    """Runs ``self._wrap(argv)`` as a child process; subclasses choose wrapper and env."""

    def _wrap(self, argv: list[str]) -> list[str]:
        return argv

    @abc.abstractmethod
    def _environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """The complete environment of a command given its per-call ``env``."""

    async def run(
        self,
        command: Sequence[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        # A parameter rather than the caller's asyncio.timeout: expiry must kill the
        # command's process group and say which command it was.
        timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109
        input: bytes | str | None = None,
    ) -> CommandResult:
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        if not argv:
            raise HostCommandError("empty host command")
        program = _program_name(argv) if not isinstance(command, str) else "sh -c"
        extra_env = dict(env or {})
        data = input.encode() if isinstance(input, str) else input
        log.debug(
            "running host command",
            extra={"program": program, "env": redact_env(extra_env), "timeout": timeout},
        )
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *self._wrap(argv),
            stdin=asyncio.subprocess.PIPE if data is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._environment(extra_env),
            start_new_session=True,
        )
        try:
            stdout, stderr = await asyncio.wait_for(proc.communicate(data), timeout)
        except TimeoutError:
            await _kill_and_reap(proc)
            log.warning("host command timed out", extra={"program": program, "timeout": timeout})
            raise HostCommandTimeout(program, timeout) from None
        except BaseException:
            _kill_group(proc)
            raise
        result = CommandResult(
            returncode=proc.returncode if proc.returncode is not None else -1,
            stdout=stdout.decode(errors="replace"),
            stderr=stderr.decode(errors="replace"),
        )
        log.debug(
            "host command finished",
            extra={
                "program": program,
                "returncode": result.returncode,
                "seconds": round(time.monotonic() - started, 3),
            },
        )
        return result


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    # The child leads its own session, so its pid is the process group id.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def _kill_and_reap(proc: asyncio.subprocess.Process) -> None:
    _kill_group(proc)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), _REAP_TIMEOUT)


class HostNamespaceRunner(_ProcessRunner):
    """Runs commands in the host's namespaces through ``nsenter --target 1``.

    Needs a privileged daemon pod with ``hostPID: true`` (so PID 1 is the host's init and
    the killed process group is visible). The daemon's own environment, which holds the
    Thunder API token, is not passed on: commands get the host's standard ``PATH`` plus
    ``env``.
    """

    def __init__(self, nsenter: str = "nsenter", base_env: Mapping[str, str] | None = None) -> None:
        self._nsenter = nsenter
        self._base_env = {"PATH": HOST_PATH, "LANG": "C.UTF-8", **(base_env or {})}

    def _wrap(self, argv: list[str]) -> list[str]:
        namespaces = ["--mount", "--uts", "--ipc", "--net", "--pid"]
        return [self._nsenter, "--target", "1", *namespaces, "--", *argv]

    def _environment(self, env: Mapping[str, str]) -> dict[str, str]:
        return {**self._base_env, **env}


class LocalRunner(_ProcessRunner):
    """Runs commands as local processes, with ``path_prefix`` directories first on ``PATH``.

    For tests and local runs: a fake host ``bin`` directory stands in for the host's
    ``thunder``, ``nvidia-smi``, ``curl`` or ``sudo``. ``extra_env`` is added to every
    command (after the inherited environment, before the per-call ``env``).
    """

    def __init__(
        self,
        path_prefix: Sequence[Path | str] = (),
        extra_env: Mapping[str, str] | None = None,
        *,
        inherit_env: bool = True,
    ) -> None:
        self._path_prefix = [str(p) for p in path_prefix]
        self._extra_env = dict(extra_env or {})
        self._inherit_env = inherit_env

    def _environment(self, env: Mapping[str, str]) -> dict[str, str]:
        merged = dict(os.environ) if self._inherit_env else {"PATH": HOST_PATH}
        merged.update(self._extra_env)
        merged.update(env)
        base_path = merged.get("PATH", HOST_PATH)
        merged["PATH"] = os.pathsep.join([*self._path_prefix, base_path])
        return merged
