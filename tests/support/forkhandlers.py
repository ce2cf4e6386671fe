"""Run Python code in a process whose forked children abort at once.

gRPC registers a child-side fork handler that restarts its poller; in a process with
live channels, that poller can abort the child on a closed descriptor before the child
runs its command. :func:`run_where_forked_children_abort` makes that certain instead
of rare: it runs ``code`` in a fresh interpreter that first registers a child-side
fork handler calling ``abort()``. A process start that forks (``preexec_fn``) then dies
with SIGABRT; one that uses ``vfork`` or ``posix_spawn`` runs no fork handler and works.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

_PRELUDE = """
import ctypes

_libc = ctypes.CDLL("libc.so.6", use_errno=True)
# pthread_atfork(NULL, NULL, abort); glibc exports it as __register_atfork.
assert _libc.__register_atfork(None, None, ctypes.cast(_libc.abort, ctypes.c_void_p), None) == 0
"""


def run_where_forked_children_abort(code: str, *args: str, timeout: float = 120) -> Any:
    """Run ``code`` after the prelude; it prints one JSON value last, which is returned."""
    done = subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(code), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])
