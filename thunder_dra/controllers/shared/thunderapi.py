"""The Thunder API token and the client built from it.

The token is read from the Secret named by the ThunderCluster on every pass (so a
rotated token is picked up without a restart), held as a `Secret` (it prints as a
mask) and never logged, put in status or in events; while a client holds it, the log
scrubber masks it in every record too. One `ThunderClient` is kept while the API URL
and token stay the same, so its connections are reused between passes; it sends over
aiohttp (`AiohttpTransport`), whose per-request cost is a fraction of httpx's own
transport's at an inventory pass's 1,500 requests.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry

from thunder_dra.api.thundercluster import ThunderSpec
from thunder_dra.kube.client import KubeClient
from thunder_dra.kube.errors import KubeError
from thunder_dra.kube.resources import SECRETS
from thunder_dra.process import logs
from thunder_dra.thunder import RetryPolicy, Secret, ThunderClient
from thunder_dra.thunder.aiotransport import AiohttpTransport

TOKEN_KEY: Final = "THUNDER_API_TOKEN"
# Inventory reads retry briefly: a pass that cannot read Thunder keeps everything
# published and the next pass tries again, so waiting long inside one pass buys nothing.
OPERATOR_RETRY: Final = RetryPolicy(max_attempts=4, initial_backoff=0.5, max_backoff=4.0, budget=30)
POOL_SIZE: Final = 64
"""Connections to Thunder at most: the highest spec.operator.inventoryConcurrency."""


class TokenUnavailable(Exception):
    """The Secret or its key is missing, empty or unreadable; the message says which."""

    def __init__(self, message: str, reason: str = "SecretUnavailable") -> None:
        self.reason = reason
        super().__init__(message)


async def read_token(kube: KubeClient, thunder: ThunderSpec) -> Secret:
    where = f"Secret {thunder.secret_namespace}/{thunder.secret_name}"
    try:
        secret = await kube.get_optional(
            SECRETS.item(thunder.secret_name, thunder.secret_namespace)
        )
    except KubeError as exc:
        raise TokenUnavailable(f"{where} could not be read: {exc.status} {exc.reason}") from None
    if secret is None:
        raise TokenUnavailable(f"{where} does not exist")
    encoded = (secret.get("data") or {}).get(TOKEN_KEY)
    if not encoded:
        raise TokenUnavailable(f"{where} has no key {TOKEN_KEY}")
    try:
        token = Secret(base64.b64decode(encoded, validate=True).decode("utf-8")).stripped()
    except (binascii.Error, UnicodeDecodeError):
        raise TokenUnavailable(f"{where} key {TOKEN_KEY} is not valid base64 text") from None
    if not token:
        raise TokenUnavailable(f"{where} key {TOKEN_KEY} is empty")
    return token


@dataclass(slots=True)
class _Cached:
    key: tuple[str, str]
    client: ThunderClient
    # The token's registration with the log scrubber, dropped with the client.
    mask: int


class ThunderClients:
    """One ThunderClient per (API URL, token), replaced when either changes."""

    def __init__(self, registry: CollectorRegistry, retry: RetryPolicy = OPERATOR_RETRY) -> None:
        self._registry = registry
        self._retry = retry
        self._cached: _Cached | None = None

    async def get(self, api_url: str, token: Secret) -> ThunderClient:
        # The key holds a digest of the token, never the token itself.
        digest = hashlib.sha256(token.reveal().encode()).hexdigest()
        key = (api_url, digest)
        if self._cached is not None and self._cached.key == key:
            return self._cached.client
        if self._cached is not None:
            await self._cached.client.aclose()
            logs.SECRETS.remove(self._cached.mask)
        client = ThunderClient(
            api_token=token,
            component="operator",
            base_url=api_url,
            retry=self._retry,
            registry=self._registry,
            transport=AiohttpTransport(pool_size=POOL_SIZE),
        )
        self._cached = _Cached(key, client, logs.SECRETS.add(token))
        return client

    async def aclose(self) -> None:
        if self._cached is not None:
            await self._cached.client.aclose()
            logs.SECRETS.remove(self._cached.mask)
            self._cached = None
