"""Which enrollments the fake service would call leaked (``GET /_admin/audit``).

An enrollment token is fine when it is revoked, or when it is spent and what it created is
still in use: a client token whose client is live (no ``decommissionedAt``), a server token
whose host is still listed. Every other token is a leak:

- ``unspent``: minted and never exchanged nor revoked (expired ones included: this project
  never asks for expiry, so a token it forgot stays its fault);
- ``client-decommissioned``: exchanged, its client revoked (thunder-api.md 2.8), the token
  never revoked (2.7);
- ``host-removed``: a server token whose host is gone, the token never revoked.

Separately, ``orphanClients`` lists live clients whose token was revoked (a live client
nobody can unenroll any more: what a thunder-api.md 2.7 that keeps the client alive leaves behind).
"""

from __future__ import annotations

from typing import Any

from hack.fake_thunder.state import FakeState, TokenRec, format_time


def _leak_reason(token: TokenRec, state: FakeState) -> str | None:
    if token.revoked_at is not None:
        return None
    if token.spent_at is None:
        return "unspent"
    if token.role == "client":
        client = state.clients.get(token.client_id) if token.client_id else None
        if client is None or client.decommissioned_at is not None:
            return "client-decommissioned"
        return None
    if token.host_id is None or token.host_id not in state.hosts:
        return "host-removed"
    return None


def audit(state: FakeState) -> dict[str, Any]:
    now = state.now()
    leaks = []
    for token in state.tokens.values():
        reason = _leak_reason(token, state)
        if reason is None:
            continue
        leaks.append(
            {
                "enrollmentTokenId": token.token_id,
                "role": token.role,
                "zoneId": token.zone_id,
                "state": token.state(now),
                "reason": reason,
                "clientId": token.client_id,
                "hostId": token.host_id,
                "mintedBy": token.minted_by,
                "createdAt": format_time(token.created_at),
                "expiresAt": format_time(token.expires_at),
            }
        )
    orphans = []
    for client in state.clients.values():
        issuer = state.tokens.get(client.enrollment_token_id or "")
        if client.decommissioned_at is None and issuer is not None and issuer.revoked_at:
            orphans.append({"clientId": client.client_id, "enrollmentTokenId": issuer.token_id})
    return {"tokensChecked": len(state.tokens), "leaks": leaks, "orphanClients": orphans}
