"""The per-node state directory the fake host tools read and write (``README.md`` here).

Standard library only: the tools run with whatever ``python3`` the host has, outside the
project's virtualenv. Tests use :class:`FakeHost` to prepare and inspect a directory.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

STATE_ENV = "THUNDER_FAKE_HOST"
BIN_DIR = Path(__file__).resolve().parent / "bin"
NVIDIA_FILE = "nvidia-smi.json"
THUNDER_FILE = "thunder.json"
CALLS_FILE = "calls.log"
CLIENT_CONFIG_FILE = "client-config.json"
INSTALLER_FILE = "installer.json"
INSTALLS_FILE = "installs.log"
INSTALLER_LOCK_FILE = "installer.lock"
DEFAULT_DRIVER_VERSION = "610.43.02"
MASK = "**********"


def write_json_atomic(path: Path, data: Any) -> None:
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def masked_env(env: dict[str, str]) -> dict[str, str]:
    """The THUNDER*/THUNDERD* variables, with any token-bearing value masked."""
    picked = {k: v for k, v in env.items() if k.startswith("THUNDER")}
    return {k: (MASK if "TOKEN" in k and v else v) for k, v in picked.items()}


def masked_argv(argv: list[str]) -> list[str]:
    """``NAME=value`` words (as passed to sudo) with token-bearing values masked."""
    masked = []
    for word in argv:
        name, sep, value = word.partition("=")
        secret = sep and "TOKEN" in name and name.replace("_", "").isalnum() and value
        masked.append(f"{name}={MASK}" if secret else word)
    return masked


class FakeHost:
    """One fake node: ``nvidia-smi.json``, ``thunder.json``, ``calls.log`` in ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @classmethod
    def from_env(cls) -> FakeHost:
        value = os.environ.get(STATE_ENV)
        if not value:
            raise SystemExit(f"fake host tool: {STATE_ENV} is not set")
        root = Path(value)
        root.mkdir(parents=True, exist_ok=True)
        return cls(root)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment whose PATH starts at the fake tools and points them here."""
        result = dict(os.environ if base is None else base)
        result["PATH"] = os.pathsep.join([str(BIN_DIR), result.get("PATH", "/usr/bin:/bin")])
        result[STATE_ENV] = str(self.root)
        return result

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            data = json.loads((self.root / name).read_text())
        except FileNotFoundError:
            return None
        return data if isinstance(data, dict) else None

    # nvidia-smi

    def nvidia(self) -> dict[str, Any]:
        return self._read(NVIDIA_FILE) or {"mode": "missing"}

    def set_nvidia(
        self,
        *,
        mode: str = "ok",
        driver_version: str = DEFAULT_DRIVER_VERSION,
        gpus: list[str] | None = None,
        gpu_type: str | None = None,
        error_message: str | None = None,
    ) -> None:
        """``mode``: ``ok``, ``missing`` (exit 127) or ``error`` (driver unreachable)."""
        data: dict[str, Any] = {
            "mode": mode,
            "driverVersion": driver_version,
            "cudaVersion": "13.0",
            "gpus": [{"name": name} for name in (gpus or [])],
        }
        if gpu_type is not None:
            data["gpuType"] = gpu_type
        if error_message is not None:
            data["errorMessage"] = error_message
        self.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.root / NVIDIA_FILE, data)

    # thunder / thunderd

    def thunder(self) -> dict[str, Any]:
        return self._read(THUNDER_FILE) or {"installed": False}

    def set_thunder(
        self,
        *,
        installed: bool = True,
        status: str = "healthy",
        enrollment: dict[str, Any] | None = None,
    ) -> None:
        """``status``: ``healthy``, ``unhealthy``, ``activating`` or ``unenrolled``."""
        data = self.thunder() | {"installed": installed, "status": status}
        if enrollment is not None:
            data["enrollment"] = enrollment
        self.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.root / THUNDER_FILE, data)

    def update_thunder(self, changes: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.root / THUNDER_FILE, self.thunder() | changes)

    def client_config(self) -> dict[str, Any] | None:
        return self._read(CLIENT_CONFIG_FILE)

    # installer behaviour and record

    def installer_settings(self) -> dict[str, Any]:
        return self._read(INSTALLER_FILE) or {}

    def set_installer(self, *, delay_seconds: float = 0.0, fail: bool = False) -> None:
        """``delay_seconds``: how long an install takes (between its start and its effect);
        ``fail``: the install fails (exit 1) without registering the host."""
        self.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.root / INSTALLER_FILE, {"delaySeconds": delay_seconds, "fail": fail})

    def log_install(self, entry: dict[str, Any]) -> None:
        with open(self.root / INSTALLS_FILE, "a") as handle:
            handle.write(json.dumps(entry) + "\n")

    def installs(self) -> list[dict[str, Any]]:
        """One ``start`` and one ``end`` line per installer run (``installs.log``)."""
        try:
            lines = (self.root / INSTALLS_FILE).read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    # call log

    def log_call(self, tool: str, argv: list[str], env: dict[str, str]) -> None:
        entry = {"tool": tool, "argv": masked_argv(argv), "env": masked_env(env)}
        with open(self.root / CALLS_FILE, "a") as handle:
            handle.write(json.dumps(entry) + "\n")

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        try:
            lines = (self.root / CALLS_FILE).read_text().splitlines()
        except FileNotFoundError:
            return []
        entries = [json.loads(line) for line in lines if line.strip()]
        return [e for e in entries if tool is None or e["tool"] == tool]
