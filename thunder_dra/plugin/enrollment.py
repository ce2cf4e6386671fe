"""Node enrollment on GPU-serving nodes, and keeping thunderd healthy afterwards.

A background loop, never in the way of kubelet calls:

1. ensure the node's Thunder zone exists (2.2), once per start;
2. ``thunder status --json``: healthy means enrolled; a service in transition is given
   time; an enrolled but unhealthy thunderd is restarted with ``thunder up`` (no new
   token), with backoff; not installed, no credential, or still unhealthy after
   :data:`RESTARTS_BEFORE_REINSTALL` restarts means (re)install;
3. install: journal the mint (role server, purpose node-enrollment), mint a server token
   (2.6), record its ID, run the installer in the host's namespaces with the token in its
   environment, and check ``thunder status`` again, because ``curl | sudo sh`` can exit 0
   after a failed download; then save the new token ID in ``node-enrollment.json``, revoke
   the enrollment it replaces, close the journal entry. A failure revokes the new token.

Failures are retried with jittered exponential backoff and show in logs, in
``thunder_dra_daemon_enrollment_state`` and in ``/readyz``.
"""

from __future__ import annotations

import asyncio
import logging
import random

from thunder_dra.plugin.config import DaemonConfig
from thunder_dra.plugin.crashpoints import CrashPoints
from thunder_dra.plugin.guest import host_install_command, host_install_env, host_restart_command
from thunder_dra.plugin.hostrunner import HostCommandError, HostRunner
from thunder_dra.plugin.journal import JournalEntryNotFound, MintJournal, MintPurpose, MintRole
from thunder_dra.plugin.logs import SecretScrubber
from thunder_dra.plugin.metrics import DaemonMetrics, EnrollmentState
from thunder_dra.plugin.node import NodeInfo
from thunder_dra.plugin.rollback import NodeEnrollmentView, Undo
from thunder_dra.plugin.thunderd import (
    NodeEnrollmentFile,
    NodeEnrollmentState,
    ThunderdStatus,
    read_status,
)
from thunder_dra.thunder import Secret, ThunderClient, ThunderError, scrub

RESTARTS_BEFORE_REINSTALL = 3
SETTLE_POLL = 1.0
SETTLE_TIMEOUT = 60.0
INITIAL_BACKOFF = 1.0

log = logging.getLogger(__name__)


class EnrollmentError(Exception):
    """One enrollment attempt failed; the message says which step and why."""


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
        undo: Undo,
        metrics: DaemonMetrics,
        crash: CrashPoints,
        scrubber: SecretScrubber,
        abandoned: set[str],
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
        self._file = NodeEnrollmentFile(config.node_enrollment_file)
        self._state: NodeEnrollmentState | None = None
        self._zone_id: str | None = None
        self._failed_restarts = 0
        self._force_reinstall = False
        self._rng = random.Random()  # noqa: S311 - backoff jitter
        self.ready = False
        self.last_error: str | None = None
        undo.node = NodeEnrollmentView(
            current_token_id=self._current_token_id, on_rolled_back=self._reinstall_needed
        )

    def _current_token_id(self) -> str | None:
        return self._state.enrollment_token_id if self._state else None

    def _reinstall_needed(self) -> None:
        # The rolled-back token may be the one the host's thunderd runs with: whatever
        # `thunder status` says, only a fresh install is known to be enrolled.
        self._force_reinstall = True

    @property
    def _zone(self) -> str:
        assert self._node.zone is not None  # a serving node has one (checked at start-up)
        return self._node.zone

    async def load(self) -> None:
        """Read ``node-enrollment.json`` (before journal rollback, which consults it)."""
        self._state = await self._file.load()

    async def run(self) -> None:
        """Converge forever: enroll, then check thunderd every ``thunderd_check`` seconds."""
        backoff = INITIAL_BACKOFF
        while True:
            try:
                await self.converge()
            except Exception as err:
                expected = isinstance(
                    err, EnrollmentError | ThunderError | HostCommandError | OSError | ValueError
                )
                self.ready = False
                self.last_error = str(err)
                self._metrics.set_enrollment(EnrollmentState.FAILED)
                wait = self._rng.uniform(backoff / 2, backoff)
                log.error(
                    "node enrollment failed; retrying",
                    extra={"error": str(err), "retry_in_s": round(wait, 2), "zone": self._zone},
                    exc_info=not expected,
                )
                await asyncio.sleep(wait)
                backoff = min(backoff * 2, self._config.intervals.enrollment_retry_max)
                continue
            backoff = INITIAL_BACKOFF
            await asyncio.sleep(self._config.intervals.thunderd_check)

    async def converge(self) -> None:
        if self._zone_id is None:
            self._zone_id = await self._thunder.ensure_zone(self._zone)
            log.info("thunder zone ensured", extra={"zone": self._zone, "zone_id": self._zone_id})
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
        command = host_restart_command(
            advertised_ip=ip, zone_name=self._zone, node_name=self._node.name
        )
        result = await self._runner.run(command, timeout=120.0)
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
            await self._run_installer(minted.enrollment_token)
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

    async def _run_installer(self, token: Secret) -> None:
        ip = self._node.advertised_ip or ""
        command = host_install_command(
            install_url=self._config.installer_url,
            api_url=self._config.api_url,
            advertised_ip=ip,
            zone_name=self._zone,
            node_name=self._node.name,
            port_range=self._config.thunderd_port_range,
        )
        result = await self._runner.run(
            command,
            env=host_install_env(token.reveal()),
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
