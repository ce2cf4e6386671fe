"""Behaviour switches of the fake service (thunder-api.md 6.1, 6.4), set by
``PUT /_admin/switches``.

On the wire each switch is the camelCase form of its field name (``conflictOnEnsure``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from hack.fake_thunder.messages import HttpError


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


@dataclass
class Switches:
    # thunder-api.md 6.1: zone ensure answers 409 for an existing zone instead of 200.
    conflict_on_ensure: bool = False
    # thunder-api.md 6.1: GET /hosts and GET /clients ignore ?zoneId= and list everything.
    ignore_zone_query: bool = False
    # thunder-api.md 6.1: hosts (and unenroll answers) carry serverId instead of hostId.
    server_id_spelling: bool = False
    # thunder-api.md 6.1: creates (ensure of a new zone, mint, exchange) answer 201 instead of 200.
    created201: bool = False
    # thunder-api.md 6.1: revoking an unknown or revoked token, or an unknown client,
    # answers 410, not 404.
    gone_on_revoke_unknown: bool = False
    # thunder-api.md 6.1 and 5, item 4: unenroll (2.7) revokes the token but leaves its
    # client live.
    keep_client_on_unenroll: bool = False
    # thunder-api.md 6.4: the served library differs from the digest the installer pins.
    corrupt_library: bool = False
    # thunder-api.md 6.4: the installer lacks its libthunder_sha256 line.
    omit_digest: bool = False
    # thunder-api.md 6.4: status codes for the two artifact files.
    installer_status: int = 200
    library_status: int = 200

    def to_json(self) -> dict[str, Any]:
        return {_camel(f.name): getattr(self, f.name) for f in fields(self)}

    def update(self, changes: dict[str, Any]) -> None:
        """Apply a partial update in wire spelling; nothing changes if any entry is bad."""
        known = {_camel(f.name): f for f in fields(self)}
        for name, value in changes.items():
            if name not in known:
                raise HttpError(400, "BadRequest", f"unknown switch {name!r}")
            expected = bool if known[name].type in ("bool", bool) else int
            if type(value) is not expected:
                raise HttpError(400, "BadRequest", f"switch {name!r} takes a {expected.__name__}")
        for name, value in changes.items():
            setattr(self, known[name].name, value)
