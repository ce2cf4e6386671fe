"""Fake ``sudo``: the test machine runs as root and may have no sudo at all.

Skips sudo's own options, applies leading ``NAME=value`` words to the environment, then
runs the rest as a child and waits for it (``sudo A=1 B=2 sh`` runs ``sh`` with A and B
set), as the real sudo does: its own argv, assignments included, stays in the process
list for as long as the command runs. Every use is recorded in ``calls.log`` (tokens
masked), so a test can tell that nothing used sudo.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from hack.fake_host.state import STATE_ENV, FakeHost

_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def main(argv: list[str]) -> int:
    words = list(argv)
    while words and words[0].startswith("-"):
        if words.pop(0) == "--":
            break
    env = dict(os.environ)
    while words and _ASSIGNMENT.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if os.environ.get(STATE_ENV):
        FakeHost.from_env().log_call("sudo", argv, env)
    if not words:
        print("usage: sudo [VAR=value ...] command [args ...]", file=sys.stderr)
        return 1
    try:
        return subprocess.call(words, env=env)
    except FileNotFoundError:
        print(f"sudo: {words[0]}: command not found", file=sys.stderr)
        return 1
