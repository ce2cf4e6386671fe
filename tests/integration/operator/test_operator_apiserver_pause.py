"""The operator's loops live through an API server that stops answering.

The real kube-apiserver is paused (SIGSTOP) for several times the operator's request
timeout (`--kube-request-timeout 2s` here) while the inventory loop (every 5s) and the
Client reaper (grace period 4s) run, then resumed (SIGCONT). Both loops must count
their errors in `thunder_dra_operator_loop_errors_total{loop=...}`, retry with backoff,
and go on doing their job: a zone added meanwhile is published without being asked
for, and an orphaned Client recorded afterwards is still revoked and removed.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from hack.testbed.kube import wait_for
from hack.testbed.operator import OperatorEnv
from tests.integration.operator.test_operator_reaper import (
    assert_revoked,
    client_object,
    enroll,
    record_client,
)

REQUEST_TIMEOUT = 2.0
# Many request timeouts long: every loop sees several of its calls fail in a row.
PAUSE = 12 * REQUEST_TIMEOUT

# The operator of this module (the package's `env` fixture, made faster below).
OPERATOR_ARGS = (
    "--orphan-grace-period-override",
    "4s",
    "--kube-request-timeout",
    f"{REQUEST_TIMEOUT:g}s",
)


@pytest.fixture(scope="module")
def env(env: OperatorEnv) -> OperatorEnv:
    env.patch_thundercluster({"spec": {"operator": {"reconcileInterval": "5s"}}})
    return env


def loop_errors(env: OperatorEnv, loop: str) -> float:
    return env.operator.metric("thunder_dra_operator_loop_errors_total", loop=loop)


def pass_started(env: OperatorEnv) -> float:
    return env.operator.metric("thunder_dra_operator_inventory_pass_starts_total")


def stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (state T in /proc/<pid>/stat)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def test_the_loops_survive_a_paused_apiserver(env: OperatorEnv) -> None:
    before = env.zone("before")
    env.add_zone(before, [("A6000", 2)])
    env.sync()
    assert env.devices(f"{before}/a6000") == ["a6000-0", "a6000-1"]
    reaper_passes = env.operator.metric("thunder_dra_operator_reaper_passes_total")
    wait_for(
        lambda: env.operator.metric("thunder_dra_operator_reaper_passes_total") > reaper_passes,
        "a reaper pass before the pause",
    )

    apiserver = env.cluster.pids["kube-apiserver"]
    during = env.zone("during")
    reaper_errors = loop_errors(env, "reaper")
    pass_starts = pass_started(env)
    os.kill(apiserver, signal.SIGSTOP)
    paused_at = time.monotonic()
    try:
        env.add_zone(during, [("A6000", 3)])
        # The operator is not stuck on requests that get no answer: while the API server
        # is still paused, it answers its metrics, the reaper has given up on a request
        # and counted the error (nothing else fails a reaper pass here), and the
        # inventory loop has started another pass.
        wait_for(
            lambda: loop_errors(env, "reaper") > reaper_errors,
            "a reaper error counted while the API server is paused",
            timeout=PAUSE,
        )
        wait_for(
            lambda: pass_started(env) > pass_starts,
            "an inventory pass started while the API server is paused",
            timeout=PAUSE,
        )
        assert stopped(apiserver), "the checks above must see the API server paused"
        # The rest of the pause: every loop sees several of its calls fail in a row.
        time.sleep(max(0.0, PAUSE - (time.monotonic() - paused_at)))
    finally:
        os.kill(apiserver, signal.SIGCONT)

    # The inventory loop's failures during the pause may fall in its DaemonSet or status
    # steps, which report and go on; what matters is that it publishes again.
    # Not asked for: the inventory loop's own timer publishes what Thunder has now.
    wait_for(
        lambda: env.devices(f"{during}/a6000") == ["a6000-0", "a6000-1", "a6000-2"],
        "the zone added during the pause to be published",
        timeout=90,
    )
    assert env.operator.popen is not None
    assert env.operator.popen.poll() is None

    with env.kube.namespace("paused") as namespace:
        token_id, client_id = enroll(env)
        record_client(
            env, namespace, "orphan", ("never-existed", str(uuid.uuid4())), token_id, client_id
        )
        wait_for(
            lambda: client_object(env, namespace, "orphan") is None,
            "the reaper to revoke an orphan after the pause",
            timeout=90,
        )
        assert_revoked(env, token_id, client_id)
