"""The network under :class:`~thunder_dra.kube.client.KubeClient`: aiohttp, set up by
``kubernetes.aio``'s configuration loader.

``kubernetes.aio.config`` reads the kubeconfig or the pod's service account (host, CA,
client certificate, bearer token, TLS server name, proxy) into a ``Configuration``; the
token is read through ``Configuration.get_api_key_with_prefix`` on every request, which
re-reads a rotated service-account token. Requests go out on one ``aiohttp.ClientSession``
built from that configuration rather than through the generated ``ApiClient``: that
client serialises typed models, rewrites a JSON-patch's content type when the body is not
a list, reaches raw JSON only through its internal request methods and has no seam for a
test transport. Owning the session keeps the request path public, small and testable.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Final

import aiohttp
from kubernetes.aio import config as k8s_config
from kubernetes.aio.client import Configuration
from yarl import URL

from thunder_dra.kube.client import DEFAULT_TIMEOUT, KubeClient, Request, Response, WriteObserver

CONNECT_TIMEOUT: Final = 10.0
"""Longest wait for a TCP and TLS connection (never more than the call's own timeout)."""
DEFAULT_POOL_SIZE: Final = 32
"""Connections kept to the apiserver: enough for twenty claims in flight without queueing."""
_IDEMPOTENT: Final = frozenset({"GET", "HEAD", "PUT", "DELETE"})


class TransportError(OSError):
    """The request got no HTTP answer (a reset or refused connection, a TLS failure)."""


async def load_configuration(kubeconfig: Path | None) -> Configuration:
    """The given kubeconfig, else the pod's service account, else the default kubeconfig."""
    configuration = Configuration()
    if kubeconfig is not None:
        await k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig), client_configuration=configuration
        )
        return configuration
    try:
        k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
    except k8s_config.ConfigException:
        await k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
    return configuration


def ssl_context(configuration: Configuration) -> ssl.SSLContext:
    """TLS settings of the configuration: its CA, client certificate and verification."""
    context = ssl.create_default_context(
        cafile=configuration.ssl_ca_cert, cadata=configuration.ca_cert_data
    )
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class AiohttpTransport:
    """Sends requests on one aiohttp session; the session opens on first use.

    Either ``configuration`` is given, or it is loaded on first use from ``kubeconfig``
    (see :func:`load_configuration`).
    """

    def __init__(
        self,
        kubeconfig: Path | None = None,
        *,
        configuration: Configuration | None = None,
        user_agent: str,
        pool_size: int = DEFAULT_POOL_SIZE,
    ) -> None:
        self._kubeconfig = kubeconfig
        self._configuration = configuration
        self._user_agent = user_agent
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None
        self._opening = asyncio.Lock()
        self._closed = False

    async def configuration(self) -> Configuration:
        """The loaded configuration (loading it now if no request has yet)."""
        await self.open()
        assert self._configuration is not None
        return self._configuration

    async def open(self) -> None:
        """Load the configuration and open the session; a bad kubeconfig fails here."""
        if self._session is not None:
            return
        async with self._opening:
            if self._session is not None:
                return
            if self._closed:
                raise TransportError("the Kubernetes client is closed")
            if self._configuration is None:
                self._configuration = await load_configuration(self._kubeconfig)
            configuration = self._configuration
            secure = str(configuration.host).startswith("https:")
            connector = aiohttp.TCPConnector(
                limit=self._pool_size, ssl=ssl_context(configuration) if secure else False
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                # The API server's requests carry their credential; no cookie an answer
                # (or a proxy in front of the API server) sets is kept or sent back.
                cookie_jar=aiohttp.DummyCookieJar(),
                headers={"Accept": "application/json", "User-Agent": self._user_agent},
                # A list page of ResourceSlices is a few MiB in one chunk.
                read_bufsize=2**21,
            )

    async def close(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def _headers(self, request: Request) -> dict[str, str]:
        assert self._configuration is not None
        headers: dict[str, str] = {}
        if request.content_type is not None:
            headers["Content-Type"] = request.content_type
        if request.accept is not None:
            headers["Accept"] = request.accept
        token = await self._configuration.get_api_key_with_prefix(
            "BearerToken", alias="authorization"
        )
        if token:
            headers["Authorization"] = token
        elif self._configuration.username or self._configuration.password:
            headers["Authorization"] = str(self._configuration.get_basic_auth_token())
        return headers

    async def send(self, request: Request) -> Response:
        await self.open()
        assert self._session is not None
        assert self._configuration is not None
        configuration = self._configuration
        url = URL(str(configuration.host).rstrip("/") + request.target, encoded=True)
        timeout = aiohttp.ClientTimeout(
            total=request.timeout, sock_connect=min(CONNECT_TIMEOUT, request.timeout)
        )
        headers = await self._headers(request)
        for attempt in (1, 2):
            try:
                async with self._session.request(
                    request.method,
                    url,
                    data=request.body,
                    headers=headers,
                    timeout=timeout,
                    proxy=configuration.proxy or None,
                    server_hostname=configuration.tls_server_name or None,
                ) as answer:
                    body = await answer.read()
                    return Response(answer.status, answer.reason or "", body)
            except aiohttp.ServerDisconnectedError as exc:
                # A kept-alive connection the apiserver had closed; the request was not
                # read, so an idempotent one is sent again once on a new connection.
                if attempt == 1 and request.method in _IDEMPOTENT:
                    continue
                raise TransportError(f"{type(exc).__name__}: {exc}") from None
            except aiohttp.ClientError as exc:
                if isinstance(exc, OSError):
                    raise
                raise TransportError(f"{type(exc).__name__}: {exc}") from None
        raise AssertionError("unreachable")


def build_client(
    kubeconfig: Path | None,
    *,
    user_agent: str,
    timeout: float = DEFAULT_TIMEOUT,
    pool_size: int = DEFAULT_POOL_SIZE,
    on_write: WriteObserver | None = None,
) -> KubeClient:
    """The process's client; the configuration loads on ``await client.open()`` or the
    first call."""
    transport = AiohttpTransport(kubeconfig, user_agent=user_agent, pool_size=pool_size)
    return KubeClient(transport, timeout=timeout, on_write=on_write)
