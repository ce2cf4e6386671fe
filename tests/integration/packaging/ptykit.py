"""Running a command on a pseudo-terminal, answering one prompt, as a person would."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Session:
    returncode: int
    output: str


def run_on_pty(
    argv: list[str],
    env: dict[str, str],
    *,
    prompt: str | None = None,
    answer: str = "",
    timeout: float = 180.0,
    cwd: str | None = None,
) -> Session:
    """Run ``argv`` with a terminal as stdin/stdout/stderr; type ``answer`` at ``prompt``."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd, close_fds=True
    )
    os.close(slave)
    chunks: list[bytes] = []
    answered = prompt is None
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"{argv} still running after {timeout:.0f}s: {chunks!r}")
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 4096)
                except OSError:  # EIO: the child closed the terminal
                    data = b""
                if not data:
                    if proc.poll() is not None:
                        break
                    continue
                chunks.append(data)
                text = b"".join(chunks).decode(errors="replace")
                if not answered and prompt is not None and prompt in text:
                    os.write(master, answer.encode() + b"\n")
                    answered = True
            elif proc.poll() is not None:
                break
        proc.wait(timeout=30)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    return Session(proc.returncode, output)
