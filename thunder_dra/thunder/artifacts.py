"""Fetch the Thunder installer and its pins, and download ``libthunder.so`` (thunder-api.md 3.1).

The installer's text is kept (the node install runs exactly the text fetched here) and
parsed for two lines: the artifact base URL and the library's SHA-256. A deployment may
pin the installer's own SHA-256 too; a different installer is refused before anything
runs. The library is streamed to a temporary file beside its destination, hashed on the
way, and renamed into place only if the digest matches; on any failure nothing is left.

Every artifact URL is https, also after redirects (followed here, hop by hop, at most
:data:`MAX_REDIRECTS`); plain http is accepted only for loopback hosts (local fakes), and
never once a hop was https. The artifact host is public: no credential is ever sent to it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import random
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import httpx
from opentelemetry.trace import TracerProvider
from prometheus_client import CollectorRegistry

from thunder_dra.api.syntax import is_loopback_host
from thunder_dra.thunder.errors import (
    ArtifactDigestMismatch,
    ArtifactError,
    ThunderTransportError,
    status_text_of,
)
from thunder_dra.thunder.retry import (
    DEFAULT_RETRY,
    Clock,
    RetryOn,
    RetryPolicy,
    SystemClock,
    run_with_retry,
)
from thunder_dra.thunder.telemetry import (
    TRANSPORT_ERROR_STATUS,
    mark_span_status,
    metrics_for,
    request_span,
    tracer_for,
)
from thunder_dra.version import user_agent

DEFAULT_ARTIFACT_BASE_URL = "https://get.thundercompute.com"
INSTALLER_MAX_BYTES = 1024 * 1024
LIBRARY_MAX_BYTES = 512 * 1024 * 1024
LIBRARY_NAME = "libthunder.so"
MAX_REDIRECTS = 5

_BASE_LINE = re.compile(r"^[ \t]*default_artifact_base_url='([^'\n]*)'[ \t]*$", re.MULTILINE)
_DIGEST_LINE = re.compile(r"^[ \t]*libthunder_sha256=\"([0-9a-f]{64})\"[ \t]*$", re.MULTILINE)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# Disk writes are batched so the event loop hands a thread a few large writes, not many small.
_WRITE_BATCH_BYTES = 1024 * 1024


class ArtifactURLRefused(ArtifactError):
    """An artifact URL (or a redirect to one) is not https, or leaves https for http."""


def check_artifact_url(url: str, *, kind: str, after_https: bool = False) -> str:
    """``url`` if artifacts may be fetched from it: https, or http to a loopback host
    (never after an https hop). Raises :class:`ArtifactURLRefused` naming the URL."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError as err:
        raise ArtifactURLRefused(f"{kind} URL {url!r} is not a valid URL: {err}") from None
    if parts.scheme == "https" and host:
        return url
    if parts.scheme == "http" and host and is_loopback_host(host) and not after_https:
        return url
    if parts.scheme == "http" and after_https:
        reason = "an https download must not continue over plain http"
    elif parts.scheme == "http":
        reason = "artifacts are fetched over https only (http only from a loopback host)"
    else:
        reason = "not an absolute https URL"
    raise ArtifactURLRefused(f"{kind} URL {url} refused: {reason}")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class InstallerPins:
    """What the installer declares: where the library lives and its SHA-256; and the
    installer's own text and digest (what a node install runs)."""

    installer_url: str
    artifact_base_url: str
    libthunder_sha256: str
    script: str = ""
    installer_sha256: str = ""

    @property
    def library_url(self) -> str:
        return f"{self.artifact_base_url}/{LIBRARY_NAME}"


def parse_installer(text: str, installer_url: str) -> InstallerPins:
    """Find the two pinned lines by pattern. A missing digest is an error; a missing base
    falls back to the directory the installer was served from. The declared base must
    pass :func:`check_artifact_url` (and stay https when the installer came over https)."""
    digest = _DIGEST_LINE.search(text)
    if digest is None:
        raise ArtifactError(
            f'installer {installer_url} has no line libthunder_sha256="<64 lower-case hex>";'
            " the library cannot be verified"
        )
    base = _BASE_LINE.search(text)
    if base is not None:
        base_url = base.group(1).strip().rstrip("/")
        if not base_url.startswith(("https://", "http://")):
            raise ArtifactError(
                f"installer {installer_url} declares default_artifact_base_url={base_url!r},"
                " which is not an http(s) URL"
            )
        check_artifact_url(
            base_url,
            kind=f"artifact base declared by installer {installer_url}",
            after_https=installer_url.startswith("https://"),
        )
    else:
        base_url = installer_url.rsplit("/", 1)[0]
    return InstallerPins(
        installer_url,
        base_url,
        digest.group(1),
        script=text,
        installer_sha256=sha256_hex(text.encode()),
    )


class ArtifactFetcher:
    """Downloads installer and library with retries on transport errors, 429 and 5xx."""

    def __init__(
        self,
        *,
        component: str,
        http: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 30.0,
        installer_max_bytes: int = INSTALLER_MAX_BYTES,
        library_max_bytes: int = LIBRARY_MAX_BYTES,
        retry: RetryPolicy = DEFAULT_RETRY,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        registry: CollectorRegistry | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        if http is not None and transport is not None:
            raise ValueError("pass either http or transport, not both")
        self._owns_http = http is None
        # Redirects are followed by _open, which checks every hop's URL.
        self._http = http or httpx.AsyncClient(
            transport=transport, follow_redirects=False, timeout=httpx.Timeout(timeout)
        )
        self._user_agent = user_agent(component)
        self._installer_max_bytes = installer_max_bytes
        self._library_max_bytes = library_max_bytes
        self._retry = retry
        self._clock: Clock = clock or SystemClock()
        self._rng = rng or random.Random()  # noqa: S311 - backoff jitter
        self._metrics = metrics_for(registry)
        self._tracer = tracer_for(tracer_provider)

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def fetch_installer(
        self, installer_url: str, expected_sha256: str | None = None
    ) -> InstallerPins:
        """GET the installer (200 required, at most 1 MiB) and parse its pins.

        With ``expected_sha256`` (a deployment's pin) an installer with another digest is
        refused with :class:`ArtifactDigestMismatch` naming the URL and both digests.
        """
        expected = _checked_digest(expected_sha256) if expected_sha256 else None
        check_artifact_url(installer_url, kind="installer")

        async def attempt(number: int, remaining: float) -> bytes:
            chunks: list[bytes] = []

            async def take(chunk: bytes) -> None:
                chunks.append(chunk)

            await self._stream(installer_url, self._installer_max_bytes, "installer", take)
            return b"".join(chunks)

        body = await run_with_retry(attempt, **self._retry_args())
        actual = sha256_hex(body)
        if expected is not None and not hmac.compare_digest(actual, expected):
            raise ArtifactDigestMismatch(
                f"installer {installer_url}: SHA-256 {actual} does not match the pinned"
                f" installerSHA256 {expected}; the installer was refused and nothing ran"
            )
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise ArtifactError(f"installer {installer_url} is not UTF-8 text") from None
        return parse_installer(text, installer_url)

    async def download_library(self, url: str, expected_sha256: str, destination: Path) -> Path:
        """Stream ``url`` into ``destination`` (at most 512 MiB) if its SHA-256 matches.

        ``destination``'s directory must exist. The file appears atomically, mode 0644.
        """
        expected = _checked_digest(expected_sha256)
        check_artifact_url(url, kind="library")

        async def attempt(number: int, remaining: float) -> Path:
            return await self._download_once(url, expected, destination)

        return await run_with_retry(attempt, **self._retry_args())

    def _retry_args(self) -> dict[str, Any]:
        return {
            "policy": self._retry,
            "retry_on": RetryOn.IDEMPOTENT,
            "clock": self._clock,
            "rng": self._rng,
        }

    async def _download_once(self, url: str, expected: str, destination: Path) -> Path:
        partial = destination.with_name(f".{destination.name}.{secrets.token_hex(6)}.part")
        handle = await asyncio.to_thread(_open_exclusive, partial)
        digest = hashlib.sha256()
        pending = bytearray()

        async def take(chunk: bytes) -> None:
            digest.update(chunk)
            pending.extend(chunk)
            if len(pending) >= _WRITE_BATCH_BYTES:
                await asyncio.to_thread(handle.write, bytes(pending))
                pending.clear()

        try:
            await self._stream(url, self._library_max_bytes, "library", take)
            await asyncio.to_thread(handle.write, bytes(pending))
            actual = digest.hexdigest()
            if not hmac.compare_digest(actual, expected):
                raise ArtifactDigestMismatch(
                    f"{url}: SHA-256 {actual} does not match the pinned {expected};"
                    " the library was rejected"
                )
            await asyncio.to_thread(_commit, handle, partial, destination)
        except BaseException:
            await asyncio.to_thread(_discard, handle, partial)
            raise
        return destination

    async def _stream(
        self,
        url: str,
        limit: int,
        kind: str,
        take: Callable[[bytes], Awaitable[None]],
    ) -> None:
        """GET ``url``, require 200, hand each chunk to ``take``; stop past ``limit`` bytes."""
        status_label = TRANSPORT_ERROR_STATUS
        started = time.perf_counter()
        endpoint = f"artifact:{kind}"
        with request_span(self._tracer, "GET", endpoint, 1) as span:
            try:
                response = await self._open(url, kind)
                try:
                    status_label = str(response.status_code)
                    mark_span_status(span, response.status_code)
                    await self._consume(response, url, limit, kind, take)
                finally:
                    await response.aclose()
            except ArtifactError as exc:
                mark_span_status(span, None, str(exc))
                raise
            except httpx.RequestError as exc:
                mark_span_status(span, None, type(exc).__name__)
                raise ThunderTransportError(
                    method="GET",
                    path=url,
                    reason=f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
                    request_sent=True,
                    timed_out=isinstance(exc, httpx.TimeoutException),
                ) from exc
            finally:
                self._metrics.requests.labels("GET", endpoint, status_label).inc()
                elapsed = time.perf_counter() - started
                self._metrics.latency.labels("GET", endpoint).observe(elapsed)

    async def _open(self, url: str, kind: str) -> httpx.Response:
        """GET ``url``, following redirects whose every hop passes :func:`check_artifact_url`."""
        current = url
        https_seen = url.startswith("https://")
        for _ in range(MAX_REDIRECTS + 1):
            request = self._http.build_request(
                "GET", current, headers={"User-Agent": self._user_agent}
            )
            response = await self._http.send(request, stream=True, follow_redirects=False)
            if not response.has_redirect_location:
                return response
            target = str(response.url.join(response.headers["location"]))
            await response.aclose()
            check_artifact_url(target, kind=f"{kind} {url} redirected to", after_https=https_seen)
            https_seen = https_seen or target.startswith("https://")
            current = target
        raise ArtifactError(f"{kind} {url} redirected more than {MAX_REDIRECTS} times")

    @staticmethod
    async def _consume(
        response: httpx.Response,
        url: str,
        limit: int,
        kind: str,
        take: Callable[[bytes], Awaitable[None]],
    ) -> None:
        if response.status_code != 200:
            status_text = status_text_of(response.status_code, response.reason_phrase)
            raise ArtifactError(
                f"{kind} {url} answered {response.status_code} {status_text}, expected 200",
                status=response.status_code,
            )
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ArtifactError(f"{kind} {url} is {declared} bytes, over the {limit}-byte limit")
        received = 0
        async for chunk in response.aiter_bytes():
            received += len(chunk)
            if received > limit:
                raise ArtifactError(f"{kind} {url} exceeds the {limit}-byte limit")
            await take(chunk)


def _checked_digest(value: str) -> str:
    digest = value.strip().lower()
    if not _SHA256.match(digest):
        raise ValueError("a pinned SHA-256 must be 64 hex digits")
    return digest


def _open_exclusive(path: Path) -> IO[bytes]:
    # Closed by _commit or _discard.
    return open(path, "xb")


def _commit(handle: IO[bytes], partial: Path, destination: Path) -> None:
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()
    os.chmod(partial, 0o644)
    os.replace(partial, destination)
    directory = os.open(destination.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _discard(handle: IO[bytes], partial: Path) -> None:
    handle.close()
    partial.unlink(missing_ok=True)
