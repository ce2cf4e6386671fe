"""Node enrollment on GPU-serving nodes, and keeping thunderd healthy afterwards.

A background loop, never in the way of kubelet calls:

1. ensure the node's Thunder zone exists (thunder-api.md 2.2), once per start;
2. ``thunder status --json``: healthy means enrolled; a service in transition is given
   time; an enrolled but unhealthy thunderd is restarted with ``thunder up`` (no new
   token), with backoff; not installed, no credential, or still unhealthy after
   :data:`RESTARTS_BEFORE_REINSTALL` restarts means (re)install;
3. install: fetch the installer and verify it (its pinned SHA-256, if any) before
   anything is minted; journal the mint (role server, purpose node-enrollment), mint a
   server token (thunder-api.md 2.6), record its ID, run that very installer text with
   ``sh -s`` in the host's namespaces (no ``sudo``, no second download) with the token in
   the process environment only, and check ``thunder status`` again, because an installer
   can exit 0 without enrolling; then save the new token ID in ``node-enrollment.json``, revoke the
   enrollment it replaces, close the journal entry. A failure revokes the new token.

Each pass (steps 2 and 3) runs under the node's enrollment lock, an exclusive ``flock``
on ``<state>/enrollment.lock`` shared by every daemon instance on the node (two run
during a rolling update): one instance at a time checks, restarts or installs, and each
re-reads ``node-enrollment.json`` after taking the lock, so it acts on what the other
instance did rather than on what it remembered. So the installer never runs twice at
once and no instance replaces an enrollment without revoking it. Kubelet calls do not
take this lock.

Any exception of a pass (Thunder, host commands, files, anything else) is logged, counted
in ``thunder_dra_daemon_loop_errors_total{loop="node-enrollment"}`` and retried with
jittered exponential backoff; the state shows in ``thunder_dra_daemon_enrollment_state``
and in ``/readyz``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from thunder_dra.backoff import backoff_delay
from thunder_dra.plugin.config import DaemonConfig
from thunder_dra.plugin.files.guest import (
    HOST_INSTALL_COMMAND,
    host_install_env,
    host_restart_command,
)
from thunder_dra.plugin.files.libcache import LibraryCacheError
from thunder_dra.plugin.metrics import DaemonMetrics, EnrollmentState
from thunder_dra.plugin.node.facts import NodeInfo
from thunder_dra.plugin.node.hostrunner import HostCommandError, HostRunner
from thunder_dra.plugin.node.thunderd import (
    NodeEnrollmentFile,
    NodeEnrollmentState,
    ThunderdStatus,
    read_status,
)
from thunder_dra.plugin.state.crashpoints import CrashPoints
from thunder_dra.plugin.state.journal import (
    JournalEntry,
    JournalEntryNotFound,
    MintJournal,
    MintPurpose,
    MintRole,
)
from thunder_dra.plugin.state.locks import NodeSerializeLock
from thunder_dra.process.logs import SecretScrubber
from thunder_dra.thunder import InstallerPins, Secret, ThunderClient, ThunderError, scrub

RESTARTS_BEFORE_REINSTALL = 3
SETTLE_POLL = 1.0
SETTLE_TIMEOUT = 60.0
INITIAL_BACKOFF = 1.0
LOOP_NAME = "node-enrollment"

log = logging.getLogger(__name__)


class EnrollmentError(Exception):
    """One enrollment attempt failed; the message says which step and why."""


@dataclass
class NodeEnrollmentView:
    """What rollback needs to know about the node's own enrollment."""

    current_token_id: Callable[[], str | None]
    on_rolled_back: Callable[[], None]


class MintRollback(Protocol):
    """What enrollment needs of the claims' rollback
    (:class:`thunder_dra.plugin.claims.rollback.Undo`, a layer above): settle a failed
    mint, roll back an open journal entry, and be told about the node's enrollment."""

    node: NodeEnrollmentView | None

    async def settle_failed_mint(
        self, journal: MintJournal, entry: JournalEntry, err: ThunderError
    ) -> None: ...

    async def roll_back(self, journal: MintJournal, entry: JournalEntry) -> object: ...


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


class NodeEnroller:
    def __init__(
        self,
        *,
        config: DaemonConfig,
        node: NodeInfo,
        runner: HostRunner,
        thunder: ThunderClient,
        journal: MintJournal,
        undo: MintRollback,
        metrics: DaemonMetrics,
        crash: CrashPoints,
        scrubber: SecretScrubber,
        abandoned: set[str],
        installer: Callable[[], Awaitable[InstallerPins]],
    ) -> None:
        self._config = config
        self._node = node
        self._runner = runner
        self._thunder = thunder
        self._journal = journal
        self._undo = undo
        self._metrics = metrics
        self._crash = crash
        self._scrubber = scrubber
        self._abandoned = abandoned
        self._installer = installer
        self._file = NodeEnrollmentFile(config.node_enrollment_file)
        self._lock = NodeSerializeLock(config.enrollment_lock, self.load)
        self._state: NodeEnrollmentState | None = None
        self._zone_id: str | None = None
        self._failed_restarts = 0
        self._force_reinstall = False
        self._rng = random.Random()  # noqa: S311 - backoff jitter
        self.ready = False
        self.last_error: str | None = None
        undo.node = NodeEnrollmentView(
            current_token_id=self._recorded_token_id, on_rolled_back=self._reinstall_needed
        )

    def _current_token_id(self) -> str | None:
        return self._state.enrollment_token_id if self._state else None

    def _recorded_token_id(self) -> str | None:
        # Rollback asks outside the enrollment lock (for a dead instance's journal too),
        # and another instance may have enrolled since this one last looked: the file says.
        state = self._file.peek()
        return state.enrollment_token_id if state else self._current_token_id()

    def _reinstall_needed(self) -> None:
        # The rolled-back token may be the one the host's thunderd runs with: whatever
        # `thunder status` says, only a fresh install is known to be enrolled.
        self._force_reinstall = True

    @property
    def _zone(self) -> str:
        assert self._node.zone is not None  # a serving node has one (checked at start-up)
        return self._node.zone

    async def load(self) -> None:
        """Read ``node-enrollment.json`` (at start-up before journal rollback, which consults
        it, and whenever the enrollment lock is taken)."""
        self._state = await self._file.load()

    async def run(self) -> None:
        """Converge forever: enroll, then check thunderd every ``thunderd_check`` seconds."""
        failures = 0
        while True:
            try:
                await self.converge()
            except Exception as err:
                expected = isinstance(
                    err,
                    EnrollmentError
                    | ThunderError
                    | HostCommandError
                    | LibraryCacheError
                    | OSError
                    | ValueError,
                )
                self.ready = False
                self.last_error = str(err)
                self._metrics.loop_errors.labels(LOOP_NAME).inc()
                self._metrics.set_enrollment(EnrollmentState.FAILED)
                failures += 1
                wait = backoff_delay(
                    failures,
                    base=INITIAL_BACKOFF,
                    cap=self._config.intervals.enrollment_retry_max,
                    rng=self._rng,
                )
                log.error(
                    "node enrollment failed; retrying",
                    extra={"error": str(err), "retry_in_s": round(wait, 2), "zone": self._zone},
                    exc_info=not expected,
                )
                await asyncio.sleep(wait)
                continue
            failures = 0
            await asyncio.sleep(self._config.intervals.thunderd_check)

    async def converge(self) -> None:
        if self._zone_id is None:
            self._zone_id = await self._thunder.ensure_zone(self._zone)
            log.info("thunder zone ensured", extra={"zone": self._zone, "zone_id": self._zone_id})
        async with self._lock.held():
            await self._converge_locked()

    async def _converge_locked(self) -> None:
        await self._finish_replacement()
        status = await self._settled_status()
        self._metrics.thunderd_healthy.set(1 if status.healthy else 0)
        if status.healthy and not self._force_reinstall:
            self._failed_restarts = 0
            self._mark_enrolled()
            return
        if (
            status.enrolled
            and not self._force_reinstall
            and self._failed_restarts < RESTARTS_BEFORE_REINSTALL
        ):
            await self._restart(status)
            return
        await self._install(status)

    async def _settled_status(self) -> ThunderdStatus:
        waited = 0.0
        status = await read_status(self._runner)
        while status.transitional and waited < SETTLE_TIMEOUT:
            await asyncio.sleep(SETTLE_POLL)
            waited += SETTLE_POLL
            status = await read_status(self._runner)
        return status

    def _mark_enrolled(self) -> None:
        if not self.ready:
            log.info("node enrolled and thunderd healthy", extra={"zone": self._zone})
        self.ready = True
        self.last_error = None
        self._metrics.set_enrollment(EnrollmentState.ENROLLED)

    async def _restart(self, status: ThunderdStatus) -> None:
        log.warning("thunderd is unhealthy; restarting it", extra={"detail": status.detail})
        ip = self._node.advertised_ip or ""
        command, env = host_restart_command(
            advertised_ip=ip, zone_name=self._zone, node_name=self._node.name
        )
        result = await self._runner.run(command, env=env, timeout=120.0)
        after = await self._settled_status()
        self._metrics.thunderd_healthy.set(1 if after.healthy else 0)
        if result.ok and after.healthy:
            self._metrics.thunderd_restarts.labels("success").inc()
            self._failed_restarts = 0
            self._mark_enrolled()
            return
        self._failed_restarts += 1
        self._metrics.thunderd_restarts.labels("failure").inc()
        raise EnrollmentError(
            f"thunder up did not make thunderd healthy (exit {result.returncode}, "
            f"attempt {self._failed_restarts}): {after.detail or _last_line(result.stderr)}"
        )

    async def _finish_replacement(self) -> None:
        state = self._state
        if state is None or not state.replaced_enrollment_token_id:
            return
        await self._thunder.unenroll(state.replaced_enrollment_token_id)
        log.info(
            "revoked the node enrollment that was replaced",
            extra={"enrollment_token_id": state.replaced_enrollment_token_id},
        )
        self._state = state.model_copy(update={"replaced_enrollment_token_id": None})
        await self._file.save(self._state)

    async def _install(self, status: ThunderdStatus) -> None:
        assert self._zone_id is not None
        self.ready = False
        self._metrics.set_enrollment(EnrollmentState.ENROLLING)
        log.info(
            "enrolling the node with Thunder",
            extra={"zone": self._zone, "thunderd": status.detail, "forced": self._force_reinstall},
        )
        # Fetched and verified before anything is minted: a refused installer costs no token.
        try:
            installer = await self._installer()
        except (ThunderError, LibraryCacheError) as err:
            self._metrics.enrollment_attempts.labels("failure").inc()
            raise EnrollmentError(f"the Thunder installer was refused: {err}") from None
        entry = await self._journal.begin(role=MintRole.SERVER, purpose=MintPurpose.NODE_ENROLLMENT)
        self._crash.reached("enroll:journal-begun")
        try:
            minted = await self._thunder.mint_server_token(self._zone_id)
        except ThunderError as err:
            await self._undo.settle_failed_mint(self._journal, entry, err)
            await self._roll_back(entry.entry_id)
            raise
        token_id = minted.enrollment_token_id
        key = self._scrubber.add(minted.enrollment_token)
        try:
            await self._journal.record_token_id(entry.entry_id, token_id)
            self._crash.reached("enroll:token-recorded")
            await self._run_installer(minted.enrollment_token, installer)
        except Exception:
            await self._roll_back(entry.entry_id)
            raise
        finally:
            self._scrubber.remove(key)
        previous = self._current_token_id()
        replaced = previous if previous and previous != token_id else None
        self._state = self._file.new(token_id, self._zone_id, self._zone, replaced)
        await self._file.save(self._state)
        self._crash.reached("enroll:state-saved")
        await self._journal.close(entry.entry_id)
        self._force_reinstall = False
        self._failed_restarts = 0
        self._metrics.enrollment_attempts.labels("success").inc()
        await self._finish_replacement()
        self._mark_enrolled()

    async def _roll_back(self, entry_id: str) -> None:
        self._metrics.enrollment_attempts.labels("failure").inc()
        try:
            entry = await self._journal.get(entry_id)
        except JournalEntryNotFound:
            return  # settled already: nothing was minted
        try:
            await self._undo.roll_back(self._journal, entry)
        except Exception as err:
            # Left open: the journal sweep retries it.
            self._abandoned.add(entry_id)
            log.error(
                "rolling back a failed node enrollment failed; will retry",
                extra={"entry": entry_id, "error": str(err)},
            )

    async def _run_installer(self, token: Secret, installer: InstallerPins) -> None:
        env = host_install_env(
            server_token=token.reveal(),
            api_url=self._config.api_url,
            advertised_ip=self._node.advertised_ip or "",
            zone_name=self._zone,
            node_name=self._node.name,
            port_range=self._config.thunderd_port_range,
        )
        log.info(
            "running the Thunder installer",
            extra={"installer": installer.installer_url, "sha256": installer.installer_sha256},
        )
        result = await self._runner.run(
            list(HOST_INSTALL_COMMAND),
            env=env,
            input=installer.script,
            timeout=self._config.intervals.install_timeout,
        )
        self._crash.reached("enroll:installed")
        status = await self._settled_status()
        self._metrics.thunderd_healthy.set(1 if status.healthy else 0)
        if not result.ok:
            output = scrub(_last_line(result.stderr or result.stdout), [token])
            raise EnrollmentError(
                f"the Thunder installer failed (exit {result.returncode}): {output}"
            )
        if not status.healthy:
            raise EnrollmentError(f"thunderd is not healthy after installing: {status.detail}")
