"""The test harness starts its processes without running the parent's fork handlers.

The demo and the daemon tests hold live gRPC channels (the kubelet stand-in) while they
start more daemons. gRPC's child-side fork handler restarts its poller in the child,
and the child can abort on a closed epoll descriptor before it runs its program: a
daemon that "exited" with an empty log. A start that forks and runs Python code in the
child (``preexec_fn``) runs those handlers; a start that execs straight away does not.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hack.testbed.daemon import REPO
from hack.testbed.kube import wait_for
from tests.support.forkhandlers import run_where_forked_children_abort

STARTS = """
import json, sys
from pathlib import Path
from types import SimpleNamespace

from hack.testbed.daemon import DaemonProcess
from hack.tied import start_tied

root = Path(sys.argv[1])
daemon = DaemonProcess(
    node="spawn-check",
    kubeconfig=root / "kubeconfig",
    fake=SimpleNamespace(base_url="http://127.0.0.1:9", artifact_base_url="http://127.0.0.1:9"),
    root=root,
    instance_id="spawn-check",
    extra_args=["--help"],
).start()
plain = start_tied(["/bin/sh", "-c", "echo started"], stdout=-1)
out, _ = plain.communicate(timeout=60)
print(json.dumps({
    "daemon": daemon.wait_exit(60),
    "daemon_log": daemon.log_text()[:200],
    "plain": plain.returncode,
    "plain_out": out.decode(),
}))
"""


def test_harness_starts_processes_without_the_parents_fork_handlers(tmp_path: Path) -> None:
    result = run_where_forked_children_abort(STARTS, str(tmp_path))
    # -6 (SIGABRT) is the child dying in the fork handler, before its program ran.
    assert result["daemon"] == 0, result
    assert "usage:" in result["daemon_log"], result
    assert result["plain"] == 0, result
    assert result["plain_out"].strip() == "started", result


@pytest.mark.parametrize("folder", ["hack", "bench", "tests"])
def test_no_process_start_runs_python_between_fork_and_exec(folder: str) -> None:
    # preexec_fn makes subprocess fork() and run Python code in the child: every start
    # goes through hack.tied instead, which execs setpriv straight away.
    offenders = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sorted((REPO / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bpreexec_fn\s*=", line)
    ]
    assert offenders == []


def test_a_tied_process_goes_when_the_run_that_started_it_is_killed() -> None:
    starter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\n"
            "from hack.tied import start_tied\n"
            "child = start_tied(['sleep', '300'])\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(300)\n",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert starter.stdout is not None
    child = int(starter.stdout.readline())
    # setpriv sets the signal, then becomes the command (same pid).
    wait_for(lambda: _program(child) == b"sleep", "setpriv to exec the command", timeout=30)
    starter.kill()
    starter.wait()
    wait_for(lambda: _gone(child), "the tied child to get its parent-death signal", timeout=30)


def _gone(pid: int) -> bool:
    # The child is reparented and reaped by init (or left a zombie until then).
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def _program(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
