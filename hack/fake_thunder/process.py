"""Start the fake Thunder service as a real process and read its base URL.

    with start_fake_thunder(tokens=["t0k"]) as fake:
        fake.base_url          # http://127.0.0.1:<port>
        fake.installer_url     # <base>/artifacts/install.sh
        fake.admin.leaks()     # /_admin/ calls

In a pytest fixture: ``with start_fake_thunder(...) as fake: yield fake`` stops the process
even when the test fails (SIGTERM, then SIGKILL after ``stop_timeout``).
"""

from __future__ import annotations

import json
import os
import selectors
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from hack import supervise
from hack.fake_thunder.admin_client import FakeThunderAdmin
from hack.fake_thunder.artifact_host import ARTIFACT_PREFIX

REPO_ROOT = Path(__file__).resolve().parents[2]


class FakeThunderStartError(RuntimeError):
    pass


class FakeThunderProcess:
    """A running ``python -m hack.fake_thunder``; use as a context manager or call stop()."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        base_url: str,
        log_path: Path,
        cleanup: Sequence[Path],
        stop_timeout: float,
    ) -> None:
        self.process = process
        self.base_url = base_url
        self.log_path = log_path
        self._cleanup = list(cleanup)
        self._stop_timeout = stop_timeout
        self._admin: FakeThunderAdmin | None = None
        # The CA that signed an https fake's certificate, for the admin client.
        self.ca_file: Path | None = None

    @property
    def artifact_base_url(self) -> str:
        return self.base_url + ARTIFACT_PREFIX

    @property
    def installer_url(self) -> str:
        return f"{self.artifact_base_url}/install.sh"

    @property
    def library_url(self) -> str:
        return f"{self.artifact_base_url}/libthunder.so"

    @property
    def admin(self) -> FakeThunderAdmin:
        if self._admin is None:
            http = None
            if self.ca_file is not None:
                context = ssl.create_default_context(cafile=str(self.ca_file))
                http = httpx.Client(verify=context, timeout=30.0)
            self._admin = FakeThunderAdmin(self.base_url, http=http)
        return self._admin

    def log_text(self) -> str:
        return supervise.read_log(self.log_path)

    def stop(self) -> int:
        """Stop the process (SIGTERM, then SIGKILL) and return its exit status."""
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        supervise.stop(self.process, self._stop_timeout)
        if self.process.stdout is not None:
            self.process.stdout.close()
        for path in self._cleanup:
            path.unlink(missing_ok=True)
        return self.process.returncode

    def __enter__(self) -> FakeThunderProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def read_base_url(process: subprocess.Popen[bytes], timeout: float) -> str | None:
    """The first stdout line of a starting fake, or None if it exits or ``timeout`` passes."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if selector.select(timeout=0.1):
                line = process.stdout.readline()
                return line.decode().strip() or None
            if process.poll() is not None:
                return None
    return None


def start_fake_thunder(
    *,
    tokens: Sequence[str] = (),
    seed: Mapping[str, Any] | Path | None = None,
    listen: str = "127.0.0.1:0",
    log_path: Path | None = None,
    log_level: str = "INFO",
    startup_timeout: float = 30.0,
    stop_timeout: float = 10.0,
    tls: tuple[Path, Path] | None = None,
    ca_file: Path | None = None,
) -> FakeThunderProcess:
    """Start the fake on ``listen`` (port 0: the OS picks) and wait for its base URL.

    ``tls``: certificate and key files to serve https with; ``ca_file``: the CA that
    signed that certificate, which ``admin`` then trusts."""
    cleanup: list[Path] = []
    args = [sys.executable, "-m", "hack.fake_thunder", "--listen", listen]
    if tls is not None:
        args += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
    args += ["--log-level", log_level]
    for token in tokens:
        args += ["--token", token]
    if isinstance(seed, Mapping):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
            json.dump(seed, handle)
        seed = Path(handle.name)
        cleanup.append(seed)
    if seed is not None:
        args += ["--seed", str(seed)]
    if log_path is None:
        with tempfile.NamedTemporaryFile(prefix="fake-thunder-", suffix=".log", delete=False) as f:
            log_path = Path(f.name)
        cleanup.append(log_path)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            args,
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
    started = FakeThunderProcess(process, "", log_path, cleanup, stop_timeout)
    started.ca_file = ca_file
    try:
        base_url = read_base_url(process, startup_timeout)
    except BaseException:
        started.stop()
        raise
    if base_url is None or not base_url.startswith("http"):
        log_text = started.log_text()
        started.stop()
        raise FakeThunderStartError(
            f"fake thunder did not print its URL (exit {process.returncode}): {log_text[-2000:]}"
        )
    started.base_url = base_url
    return started
