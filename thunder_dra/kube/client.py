"""The one Kubernetes client of the operator and the daemon: JSON in, JSON out, async.

Objects travel as the plain camelCase dicts the apiserver sends. The generated model
classes are skipped on purpose: a pass over thousands of ResourceSlices would build, and
serialise back, hundreds of thousands of model objects, and the daemon reads only a
handful of fields per prepare.

The network is a :class:`Transport`: :class:`~thunder_dra.kube.transport.AiohttpTransport`
in the processes (an aiohttp session set up from a ``kubernetes.aio`` Configuration), an
in-memory apiserver in unit tests (``tests/support/fakekube.py``, not shipped). Every call
is a plain coroutine, so cancelling the task that awaits it cancels the request; each has
a timeout (``request_timeout=`` per call, else the client's) and fails only with a
:class:`~thunder_dra.kube.errors.KubeError` subclass.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Protocol
from urllib.parse import urlencode

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

from thunder_dra.kube import bodies
from thunder_dra.kube.errors import (
    Gone,
    KubeError,
    NotFound,
    Timeout,
    Unavailable,
    error_class,
    from_answer,
)
from thunder_dra.kube.resources import (
    CLIENTS,
    EVENTS,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    SECRETS,
    path_template,
    resource_of,
)
from thunder_dra.spans import step_span
from thunder_dra.version import __version__

JSON = dict[str, Any]
# One client span per request; by default from the process's global tracer provider.
_tracer = trace.get_tracer("thunder_dra.kube", __version__)
# A refused request's span keeps the reason of the answer (``NotFound``), cut to this.
_SPAN_REASON_CHARS = 64

JSON_CONTENT: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"

METADATA_ONLY: Final = (
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
)
"""Accept header of a list of the items' metadata alone (whole items from a server that
cannot, which callers reading only metadata do not mind)."""

DEFAULT_TIMEOUT: Final = 20.0
"""Seconds one call may take, connecting and reading the whole answer included."""
LIST_PAGE_SIZE: Final = 100
"""Objects per list page: a page of ResourceSlices with 128 devices each stays a few MiB."""
WATCH_WINDOW: Final = 5
"""Seconds one :meth:`KubeClient.watch_window` lasts."""

_VERBS: Final = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request to the apiserver; ``path`` starts with ``/api`` or ``/apis``."""

    method: str
    path: str
    query: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None
    content_type: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    accept: str | None = None
    """The Accept header when not plain JSON (e.g. a metadata-only list)."""

    @property
    def target(self) -> str:
        """The path with its query string."""
        return f"{self.path}?{urlencode(self.query)}" if self.query else self.path


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    reason: str = ""
    body: bytes = b""


class Transport(Protocol):
    """Sends requests. No answer at all is an ``OSError``; any HTTP answer is a Response."""

    async def open(self) -> None:
        """Get ready to send (load credentials, open connections); idempotent."""

    async def send(self, request: Request) -> Response: ...

    async def close(self) -> None: ...


WriteObserver = Callable[[str, str], None]
"""Called with (resource, verb) before each write, e.g. ("clients/status", "patch")."""


def _encode(body: Any) -> bytes | None:
    if body is None or isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    return json.dumps(body, separators=(",", ":")).encode()


class KubeClient:
    """Async access to the apiserver with dict bodies; one per process.

    The generic calls take an API path (see :mod:`thunder_dra.kube.resources`); the
    typed ones at the end name the objects the daemon reads and writes.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        on_write: WriteObserver | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
        self.transport = transport
        self.timeout = timeout
        self._on_write = on_write
        self._tracer = tracer or _tracer

    async def open(self) -> None:
        """Load the configuration and open the connection pool now rather than on the first
        call, so a bad kubeconfig fails at start-up."""
        await self.transport.open()

    async def close(self) -> None:
        """Release the transport (the aiohttp session and its connections)."""
        await self.transport.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    # -- the raw path ------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | Sequence[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str | None = None,
        request_timeout: float | None = None,
        accept: str | None = None,
    ) -> Any:
        """One API call; the decoded JSON answer (None for an empty one).

        ``body`` is JSON-encoded unless it is bytes or str (e.g. an apply-patch in YAML).
        Writes are reported to ``on_write`` unless they are dry runs.
        """
        method = method.upper()
        pairs = tuple(query.items() if isinstance(query, Mapping) else (query or ()))
        encoded = _encode(body)
        request = Request(
            method=method,
            path=path,
            query=pairs,
            body=encoded,
            content_type=(content_type or JSON_CONTENT) if encoded is not None else None,
            timeout=self.timeout if request_timeout is None else request_timeout,
            accept=accept,
        )
        dry_run = any(key == "dryRun" for key, _ in pairs)
        if self._on_write is not None and method in _VERBS and not dry_run:
            self._on_write(resource_of(path), _VERBS[method])
        template = path_template(path)
        with step_span(
            self._tracer,
            # "kube:" tells these from the Thunder API's spans, whose paths also start /api/v1.
            f"{method} kube:{template}",
            kind=SpanKind.CLIENT,
            attributes={
                "http.request.method": method,
                "url.template": template,
                "k8s.resource": resource_of(path),
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                response = await self._send(request)
            except Exception as err:
                reason = err.reason if isinstance(err, KubeError) else type(err).__name__
                span.set_status(Status(StatusCode.ERROR, reason[:_SPAN_REASON_CHARS]))
                raise
            span.set_attribute("http.response.status_code", response.status)
            if not 200 <= response.status <= 299:
                refused = from_answer(method, path, response.status, response.reason, response.body)
                span.set_status(Status(StatusCode.ERROR, refused.reason[:_SPAN_REASON_CHARS]))
                raise refused
        if not response.body:
            return None
        try:
            return json.loads(response.body)
        except ValueError as exc:
            raise KubeError(
                method, path, response.status, "InvalidAnswer", f"answer is not JSON: {exc}"
            ) from None

    async def _send(self, request: Request) -> Response:
        try:
            async with asyncio.timeout(request.timeout):
                return await self.transport.send(request)
        except TimeoutError:
            raise Timeout(
                request.method,
                request.path,
                None,
                "Timeout",
                f"no complete answer within {request.timeout:g}s",
            ) from None
        except OSError as exc:
            raise Unavailable(
                request.method, request.path, None, type(exc).__name__, str(exc)
            ) from None

    # -- reads -------------------------------------------------------------------------

    async def get(self, path: str, *, request_timeout: float | None = None) -> JSON:
        """The object at ``path``; :class:`NotFound` if there is none."""
        found: JSON = await self.request("GET", path, request_timeout=request_timeout)
        return found

    async def get_optional(self, path: str, *, request_timeout: float | None = None) -> JSON | None:
        """The object at ``path``, or None if it does not exist."""
        try:
            return await self.get(path, request_timeout=request_timeout)
        except NotFound:
            return None

    async def list_pages(
        self,
        collection: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = LIST_PAGE_SIZE,
        accept: str | None = None,
    ) -> AsyncIterator[list[JSON]]:
        """The items of a collection a page at a time, so a caller can shrink them early.

        An expired continue token raises :class:`Gone`: the pages already yielded are a
        stale prefix, so the caller starts again. ``accept`` asks for another shape of
        list, e.g. :data:`METADATA_ONLY` (the items' metadata alone).
        """
        async for page in self._pages(collection, label_selector, field_selector, limit, accept):
            items: list[JSON] = page.get("items") or []
            yield items

    async def _pages(
        self,
        collection: str,
        label_selector: str | None,
        field_selector: str | None,
        limit: int,
        accept: str | None = None,
    ) -> AsyncIterator[JSON]:
        """The list answers of a collection, a page each, until no continue token is left."""
        token = ""
        while True:
            query = {"limit": str(limit)}
            if label_selector:
                query["labelSelector"] = label_selector
            if field_selector:
                query["fieldSelector"] = field_selector
            if token:
                query["continue"] = token
            page: JSON = await self.request("GET", collection, query=query, accept=accept) or {}
            yield page
            token = bodies.list_continue(page)
            if not token:
                return

    async def list_all(
        self,
        collection: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[JSON]:
        """Every item of a collection; a list whose continue token expired is read again once."""
        items, _ = await self._whole_list(collection, label_selector, field_selector)
        return items

    async def list_with_version(
        self, collection: str, *, limit: int = LIST_PAGE_SIZE
    ) -> tuple[list[JSON], str]:
        """Every item of a collection, a page at a time, and the list's resourceVersion
        (every page is read from the same one), to watch from; a list whose continue token
        expired is read again once."""
        return await self._whole_list(collection, None, None, limit)

    async def _whole_list(
        self,
        collection: str,
        label_selector: str | None,
        field_selector: str | None,
        limit: int = LIST_PAGE_SIZE,
    ) -> tuple[list[JSON], str]:
        for attempt in (1, 2):
            items: list[JSON] = []
            version = ""
            try:
                async for page in self._pages(collection, label_selector, field_selector, limit):
                    items.extend(page.get("items") or [])
                    version = version or str(bodies.metadata(page).get("resourceVersion") or "")
            except Gone:
                if attempt == 2:
                    raise
                continue
            return items, version
        raise AssertionError("unreachable")

    async def watch_window(
        self, collection: str, *, resource_version: str, seconds: int = WATCH_WINDOW
    ) -> tuple[list[JSON], str]:
        """The changes to a collection after ``resource_version``: one watch that the
        apiserver ends after ``seconds``, read whole. Returns its events (``type``,
        ``object``; bookmarks left out) and the resourceVersion to watch on from.

        Each window is served from the apiserver's watch cache, so a caller that loops
        sees every change at most ``seconds`` late for the price of one short request per
        window. :class:`Gone` means the version is too old: list again.
        """
        query = (
            ("watch", "1"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(seconds)),
            ("allowWatchBookmarks", "true"),
        )
        request = Request("GET", collection, query=query, timeout=seconds + self.timeout)
        response = await self._send(request)
        if not 200 <= response.status <= 299:
            raise from_answer("GET", collection, response.status, response.reason, response.body)
        events: list[JSON] = []
        version = resource_version
        for line in response.body.splitlines():
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError as exc:
                raise KubeError(
                    "GET", collection, response.status, "InvalidAnswer", f"watch event: {exc}"
                ) from None
            kind = event.get("type") if isinstance(event, dict) else None
            obj = event.get("object") if isinstance(event, dict) else None
            if not isinstance(obj, dict):
                continue
            if kind == "ERROR":
                code = obj.get("code")
                status = code if isinstance(code, int) else 500
                raise error_class(status)(
                    "GET",
                    collection,
                    status,
                    str(obj.get("reason") or ""),
                    str(obj.get("message") or ""),
                )
            version = str(bodies.metadata(obj).get("resourceVersion") or version)
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                events.append(event)
        return events, version

    # -- writes ------------------------------------------------------------------------

    async def create(
        self,
        collection: str,
        body: Mapping[str, Any],
        *,
        dry_run: bool = False,
        request_timeout: float | None = None,
    ) -> JSON:
        """Create; a Conflict (reason AlreadyExists) if the name is taken."""
        query = {"dryRun": "All"} if dry_run else None
        created: JSON = await self.request(
            "POST", collection, body=body, query=query, request_timeout=request_timeout
        )
        return created

    async def replace(
        self, path: str, body: Mapping[str, Any], *, request_timeout: float | None = None
    ) -> JSON:
        """Replace (PUT); a stale ``metadata.resourceVersion`` in ``body`` is a Conflict."""
        replaced: JSON = await self.request("PUT", path, body=body, request_timeout=request_timeout)
        return replaced

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> JSON:
        """An RFC 7386 merge patch: a None value removes the field."""
        patched: JSON = await self.request("PATCH", path, body=patch, content_type=MERGE_PATCH)
        return patched

    async def json_patch(self, path: str, operations: Sequence[Mapping[str, Any]]) -> JSON:
        """An RFC 6902 JSON patch; a failing ``test`` operation is Invalid (422)."""
        patched: JSON = await self.request(
            "PATCH", path, body=list(operations), content_type=JSON_PATCH
        )
        return patched

    async def apply(
        self, path: str, body: Mapping[str, Any], *, field_manager: str, force: bool = False
    ) -> JSON:
        """Server-side apply of ``body`` (JSON is valid YAML) as ``field_manager``."""
        query = {"fieldManager": field_manager}
        if force:
            query["force"] = "true"
        applied: JSON = await self.request(
            "PATCH", path, body=body, query=query, content_type=APPLY_PATCH
        )
        return applied

    async def delete(
        self,
        path: str,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation: str | None = None,
    ) -> JSON:
        """Delete; the answer is the object (kept, Terminating, while it has finalizers) or
        a Status. :class:`NotFound` if it was already gone; a precondition (``uid``,
        ``resource_version``) that no longer holds is a Conflict."""
        body: JSON = {"apiVersion": "v1", "kind": "DeleteOptions"}
        preconditions = {
            key: value
            for key, value in (("uid", uid), ("resourceVersion", resource_version))
            if value
        }
        if preconditions:
            body["preconditions"] = preconditions
        if propagation:
            body["propagationPolicy"] = propagation
        answer: JSON = await self.request("DELETE", path, body=body) or {}
        return answer

    # -- the objects the daemon reads and writes -----------------------------------------

    async def get_node(self, name: str) -> JSON:
        return await self.get(NODES.item(name))

    async def get_pod(self, namespace: str, name: str) -> JSON:
        return await self.get(PODS.item(name, namespace))

    async def get_claim(self, namespace: str, name: str) -> JSON:
        return await self.get(RESOURCE_CLAIMS.item(name, namespace))

    async def list_slices(self, *, driver: str, label_selector: str) -> list[JSON]:
        """This driver's ResourceSlices matching ``label_selector``."""
        return await self.list_all(
            RESOURCE_SLICES.collection(),
            label_selector=label_selector,
            field_selector=f"spec.driver={driver}",
        )

    async def get_secret(self, namespace: str, name: str) -> JSON:
        return await self.get(SECRETS.item(name, namespace))

    async def create_secret(self, namespace: str, body: Mapping[str, Any]) -> JSON:
        return await self.create(SECRETS.collection(namespace), body)

    async def replace_secret(self, namespace: str, name: str, body: Mapping[str, Any]) -> JSON:
        return await self.replace(SECRETS.item(name, namespace), body)

    async def delete_secret(self, namespace: str, name: str, uid: str | None = None) -> None:
        await self.delete(SECRETS.item(name, namespace), uid=uid)

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        await self.create(EVENTS.collection(namespace), body)

    async def list_clients(self, *, label_selector: str) -> list[JSON]:
        """Clients in every namespace matching ``label_selector``."""
        return await self.list_all(CLIENTS.collection(), label_selector=label_selector)

    async def get_client(self, namespace: str, name: str) -> JSON:
        return await self.get(CLIENTS.item(name, namespace))

    async def create_client(self, namespace: str, body: Mapping[str, Any]) -> JSON:
        return await self.create(CLIENTS.collection(namespace), body)

    async def patch_client(self, namespace: str, name: str, patch: Mapping[str, Any]) -> JSON:
        return await self.merge_patch(CLIENTS.item(name, namespace), patch)

    async def json_patch_client(
        self, namespace: str, name: str, operations: Sequence[Mapping[str, Any]]
    ) -> JSON:
        return await self.json_patch(CLIENTS.item(name, namespace), operations)

    async def json_patch_client_status(
        self, namespace: str, name: str, operations: Sequence[Mapping[str, Any]]
    ) -> JSON:
        return await self.json_patch(CLIENTS.item(name, namespace, "status"), operations)

    async def delete_client(self, namespace: str, name: str, *, uid: str | None = None) -> JSON:
        """Delete (only the record with ``uid``, if given); the answer is the Client (still
        there, Terminating, while it has finalizers) or a Status (it is gone)."""
        return await self.delete(CLIENTS.item(name, namespace), uid=uid)
