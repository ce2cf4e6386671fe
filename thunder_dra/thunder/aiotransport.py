"""An httpx transport that sends over aiohttp, for callers making many small requests.

httpx's own transport (httpcore) spends several milliseconds of CPU per request in
pure Python; an inventory pass makes one request per zone and endpoint (1,501 for 500
zones). aiohttp parses HTTP in C, so `AiohttpTransport` takes httpx's requests and gives
httpx's responses and exceptions, everything `Wire` relies on (request building,
timeouts, streaming and decoded reads), at a fraction of the cost. `Wire` hands it each
request itself, without httpx's client layer (cookies, redirects, default headers) in
between; the default transport of every `ThunderClient`.

What maps to what:

- httpx's per-request timeouts: `connect` and `pool` bound getting a connection
  (`ConnectTimeout`), `read` bounds each wait for bytes (`ReadTimeout`);
- a refused or unresolvable connection is `ConnectError`, a connection dropped before the
  answer `RemoteProtocolError`, a broken body `ReadError`;
- TLS is verified with httpx's default context (its CA bundle, `SSL_CERT_FILE`), and
  proxies come from the environment (`HTTPS_PROXY`, `NO_PROXY`...), as with httpx,
  looked up once per scheme and host (aiohttp's own `trust_env` would read them, and
  `~/.netrc`, on every request);
- bodies are passed on undecoded (httpx decodes them); at most `pool_size` connections
  are open, kept alive between requests;
- no cookie jar: a cookie an answer sets is never sent on a later request.
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.request
from collections.abc import AsyncIterator
from typing import Final

import aiohttp
import httpx

CHUNK_BYTES: Final = 65536
_SKIPPED_HEADERS: Final = frozenset({"host", "content-length", "connection", "transfer-encoding"})


class _Body(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_chunked(CHUNK_BYTES):
                yield chunk
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise httpx.ReadTimeout(str(exc) or "read timed out", request=self._request) from exc
        except aiohttp.ClientError as exc:
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}", request=self._request) from exc

    async def aclose(self) -> None:
        if self._response.content.at_eof():
            self._response.release()
        else:
            # A body left unread (over a size cap, say) would poison a kept-alive connection.
            self._response.close()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """Sends httpx requests with one aiohttp session of at most `pool_size` connections."""

    def __init__(self, *, pool_size: int = 8, verify: ssl.SSLContext | None = None) -> None:
        if pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, got {pool_size}")
        self._pool_size = pool_size
        self._ssl = verify
        self._session: aiohttp.ClientSession | None = None
        self._proxies: dict[tuple[str, str], str | None] = {}

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            if self._ssl is None:
                self._ssl = httpx.create_ssl_context()
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._pool_size, ssl=self._ssl),
                # No cookie an answer sets is kept or sent back (thunder-api.md section 1).
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._open()
        limits = request.extensions.get("timeout") or {}
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=_seconds(limits.get("pool"), limits.get("connect")),
            sock_connect=limits.get("connect"),
            sock_read=limits.get("read"),
        )
        headers = [
            (name, value)
            for name, value in request.headers.multi_items()
            if name.lower() not in _SKIPPED_HEADERS
        ]
        body = await request.aread()
        try:
            response = await session.request(
                request.method,
                str(request.url),
                headers=headers,
                data=body or None,
                timeout=timeout,
                allow_redirects=False,
                proxy=self._proxy(request.url),
            )
        except aiohttp.ConnectionTimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc) or "connect timed out", request=request) from exc
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise httpx.ReadTimeout(str(exc) or "read timed out", request=request) from exc
        except aiohttp.ClientConnectorError as exc:
            raise httpx.ConnectError(f"{type(exc).__name__}: {exc}", request=request) from exc
        except aiohttp.ServerDisconnectedError as exc:
            raise httpx.RemoteProtocolError(
                f"{type(exc).__name__}: {exc}", request=request
            ) from exc
        except aiohttp.ClientError as exc:
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}", request=request) from exc
        return httpx.Response(
            response.status,
            headers=list(response.raw_headers),
            stream=_Body(response, request),
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": (response.reason or "").encode("latin-1", "replace"),
            },
            request=request,
        )

    def _proxy(self, url: httpx.URL) -> str | None:
        key = (url.scheme, url.host)
        if key not in self._proxies:
            proxies = urllib.request.getproxies_environment()
            bypass = bool(urllib.request.proxy_bypass(url.host, proxies))
            self._proxies[key] = None if bypass else proxies.get(url.scheme)
        return self._proxies[key]

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
            # Let the connector's transports finish closing inside the loop.
            await asyncio.sleep(0)


def _seconds(*values: float | None) -> float | None:
    found = [value for value in values if value is not None]
    return min(found) if found else None
