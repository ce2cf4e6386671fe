"""The operator's Thunder token is masked in its logs for as long as a client holds it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from thunder_dra.controllers.shared.thunderapi import ThunderClients
from thunder_dra.process.logs import SECRETS
from thunder_dra.thunder import MASK, Secret


async def test_the_operator_token_is_scrubbed_while_in_use() -> None:
    clients = ThunderClients(CollectorRegistry())
    first, rotated = "thunder-token-first-0123", "thunder-token-rotated-4567"
    await clients.get("http://127.0.0.1:9", Secret(first))
    assert SECRETS.scrub(f"Bearer {first}") == f"Bearer {MASK}"
    await clients.get("http://127.0.0.1:9", Secret(rotated))
    assert SECRETS.scrub(f"{first} {rotated}") == f"{first} {MASK}"
    await clients.aclose()
    assert SECRETS.scrub(rotated) == rotated
