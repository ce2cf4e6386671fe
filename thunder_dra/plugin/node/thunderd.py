"""thunderd on the host: read ``thunder status --json``, restart it, remember its enrollment.

The status document (thunder-api.md 3.3) may come with a non-zero exit, so stdout is
parsed first; exit 127 means the ``thunder`` CLI is not installed. Healthy is
``healthy``, or a healthy local API with an auth token configured. An ``activating``,
``deactivating`` or ``reloading`` service is in transition and is waited for, not
repaired.

The node's enrollment (the server token ID the installer consumed) is kept in
``<state>/node-enrollment.json``, so the next enrollment can revoke the one it replaces.
While a replacement is in progress the file also names the replaced token, so a crash
between installing the new one and revoking the old one is finished at the next start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from thunder_dra import fsutil
from thunder_dra.plugin.node.hostrunner import CommandResult, HostCommandError, HostRunner

STATUS_COMMAND = ("thunder", "status", "--json")
TRANSITIONAL = frozenset({"activating", "deactivating", "reloading"})
_NOT_INSTALLED_EXIT = 127
STATUS_TIMEOUT = 30.0


@dataclass(frozen=True)
class ThunderdStatus:
    installed: bool
    healthy: bool
    transitional: bool
    auth_configured: bool
    detail: str

    @property
    def enrolled(self) -> bool:
        """Installed with a credential: restarting it (``thunder up``) can make it healthy."""
        return self.installed and self.auth_configured


NOT_INSTALLED = ThunderdStatus(False, False, False, False, "the thunder CLI is not installed")


def _diagnostics(document: dict[str, Any]) -> str:
    parts = []
    for item in document.get("diagnostics") or []:
        if isinstance(item, dict) and item.get("message"):
            parts.append(str(item["message"]))
    for warning in document.get("warnings") or []:
        if warning and str(warning) not in parts:
            parts.append(str(warning))
    local_api = document.get("localApi") or {}
    if isinstance(local_api, dict) and local_api.get("error"):
        parts.append(f"local API: {local_api['error']}")
    return "; ".join(parts)


def parse_status(result: CommandResult) -> ThunderdStatus:
    """Interpret one run of ``thunder status --json``."""
    if result.returncode == _NOT_INSTALLED_EXIT:
        return NOT_INSTALLED
    try:
        document = json.loads(result.stdout)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        line = (result.stderr or result.stdout).strip().splitlines()
        detail = line[0] if line else "no output"
        return ThunderdStatus(
            True, False, False, False, f"unreadable status (exit {result.returncode}): {detail}"
        )
    service = document.get("service") or {}
    local_api = document.get("localApi") or {}
    settings = document.get("config") or {}
    auth = bool(isinstance(settings, dict) and settings.get("authTokenConfigured"))
    local_ok = bool(isinstance(local_api, dict) and local_api.get("healthy"))
    healthy = bool(document.get("healthy")) or (local_ok and auth)
    active = str(service.get("active", "")) if isinstance(service, dict) else ""
    return ThunderdStatus(
        installed=True,
        healthy=healthy,
        transitional=active in TRANSITIONAL,
        auth_configured=auth,
        detail=_diagnostics(document) or ("healthy" if healthy else f"service {active or '?'}"),
    )


async def read_status(runner: HostRunner) -> ThunderdStatus:
    try:
        result = await runner.run(list(STATUS_COMMAND), timeout=STATUS_TIMEOUT)
    except FileNotFoundError:
        return NOT_INSTALLED
    except HostCommandError as err:
        return ThunderdStatus(True, False, False, False, str(err))
    return parse_status(result)


class NodeEnrollmentState(BaseModel):
    """``<state>/node-enrollment.json``: which server token this node's thunderd consumed."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )

    enrollment_token_id: str
    zone_id: str
    zone_name: str
    enrolled_at: datetime
    replaced_enrollment_token_id: str | None = None


class NodeEnrollmentFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    async def load(self) -> NodeEnrollmentState | None:
        try:
            data = await fsutil.read_bytes_async(self.path)
        except FileNotFoundError:
            return None
        try:
            return NodeEnrollmentState.model_validate_json(data)
        except ValidationError:
            await fsutil.move_aside_async(self.path)
            return None

    def peek(self) -> NodeEnrollmentState | None:
        """The recorded state, read now (a few hundred bytes); None if absent or unreadable.
        Unlike :meth:`load` it never moves a bad file aside."""
        try:
            return NodeEnrollmentState.model_validate_json(self.path.read_bytes())
        except (OSError, ValidationError):
            return None

    async def save(self, state: NodeEnrollmentState) -> None:
        content = state.model_dump_json(by_alias=True, indent=2) + "\n"
        await fsutil.write_atomic_async(self.path, content, mode=0o600)

    @staticmethod
    def new(
        token_id: str, zone_id: str, zone_name: str, replaced: str | None
    ) -> NodeEnrollmentState:
        return NodeEnrollmentState(
            enrollment_token_id=token_id,
            zone_id=zone_id,
            zone_name=zone_name,
            enrolled_at=datetime.now(UTC),
            replaced_enrollment_token_id=replaced,
        )
