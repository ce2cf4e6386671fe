"""One HTTP attempt against the Thunder API: headers, capped streaming read, error mapping,
metrics and a span. Retrying is the caller's business (see ``retry.py``)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from opentelemetry.trace import Tracer
from pydantic import BaseModel, ValidationError

from thunder_dra.thunder.errors import ThunderResponseError, ThunderTransportError, api_error
from thunder_dra.thunder.redact import Secret
from thunder_dra.thunder.retry import RetryOn
from thunder_dra.thunder.telemetry import (
    TRANSPORT_ERROR_STATUS,
    ThunderMetrics,
    mark_span_status,
    request_span,
)

_M = TypeVar("_M", bound=BaseModel)


# Failures raised before a single byte of the request was written: retrying these cannot
# duplicate a side effect on the server.
_UNSENT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass(frozen=True)
class Endpoint:
    """An API operation: its method, path template (the metric label) and retry rule."""

    method: str
    template: str
    retry_on: RetryOn

    def path(self, **params: str) -> str:
        for name, value in params.items():
            if not value:
                raise ValueError(f"{name} must not be empty for {self.method} {self.template}")
        # Quoting every character keeps an ID from smuggling '/', '?' or '..' into the path.
        return self.template.format(**{k: quote(v, safe="") for k, v in params.items()})


@dataclass(frozen=True)
class WireResponse:
    """A 2xx answer, body read in full (within the cap)."""

    method: str
    path: str
    status: int
    body: bytes

    def json_object(self) -> dict[str, Any] | None:
        """The body as a JSON object, ``None`` if empty; anything else is an unusable answer."""
        if not self.body.strip():
            return None
        try:
            parsed = json.loads(self.body)
        except ValueError as exc:
            # The position, never the content: a malformed mint or exchange answer holds secrets.
            raise self.unusable(f"body is not valid JSON ({_json_problem(exc)})") from None
        if not isinstance(parsed, dict):
            raise self.unusable(f"body is a JSON {type(parsed).__name__}, expected an object")
        return parsed

    def parse(self, model: type[_M], data: Mapping[str, Any] | None = None) -> _M:
        """Validate ``data`` (default: the body) as ``model``; problems name the fields."""
        if data is None:
            data = self.json_object()
            if data is None:
                raise self.unusable("body is empty, expected a JSON object")
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise self.unusable(describe_validation_error(exc)) from None

    def unusable(self, problem: str) -> ThunderResponseError:
        return ThunderResponseError(
            method=self.method, path=self.path, status=self.status, problem=problem
        )


def _json_problem(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    return type(exc).__name__


def describe_validation_error(exc: ValidationError) -> str:
    """Field paths and reasons, never the offending values (they may be secrets)."""
    parts = []
    for err in exc.errors(include_input=False, include_url=False, include_context=False):
        location = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"field {location!r}: {err['msg']}")
    return "; ".join(parts)


@contextlib.asynccontextmanager
async def _answer(
    transport: httpx.AsyncBaseTransport, request: httpx.Request
) -> AsyncIterator[httpx.Response]:
    """The transport's answer to ``request``, closed on the way out (read or not)."""
    response = await transport.handle_async_request(request)
    try:
        yield response
    finally:
        await response.aclose()


def _retry_after_seconds(headers: httpx.Headers) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


class Wire:
    """Sends single requests with the client's headers, limits and instrumentation."""

    def __init__(
        self,
        *,
        transport: httpx.AsyncBaseTransport,
        base_url: str,
        user_agent: str,
        timeout: httpx.Timeout,
        max_response_bytes: int,
        metrics: ThunderMetrics,
        tracer: Tracer,
        secrets: Iterable[Secret],
    ) -> None:
        self._transport = transport
        self._base_url = base_url
        self._user_agent = user_agent
        self._timeout = timeout
        self._max_response_bytes = max_response_bytes
        self._metrics = metrics
        self._tracer = tracer
        self._secrets = list(secrets)

    def _timeout_within(self, time_cap: float | None) -> httpx.Timeout:
        if time_cap is None:
            return self._timeout
        cap = max(time_cap, 0.001)

        def bound(value: float | None) -> float:
            return cap if value is None else min(value, cap)

        return httpx.Timeout(
            connect=bound(self._timeout.connect),
            read=bound(self._timeout.read),
            write=bound(self._timeout.write),
            pool=bound(self._timeout.pool),
        )

    async def send(
        self,
        endpoint: Endpoint,
        path: str,
        *,
        bearer: Secret,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        attempt: int = 1,
        time_cap: float | None = None,
    ) -> WireResponse:
        """One attempt; raises the matching ``ThunderError`` for anything but a usable 2xx."""
        method = endpoint.method
        headers = {
            "Authorization": f"Bearer {bearer.reveal()}",
            "Accept": "application/json",
            "User-Agent": self._user_agent,
        }
        content: bytes | None = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            content = json.dumps(body, separators=(",", ":")).encode()
        status_label = TRANSPORT_ERROR_STATUS
        started = time.perf_counter()
        # Straight to the transport: no cookies kept, no redirects followed, no default
        # headers; httpx's client layer above it cost a third of a request's CPU.
        request = httpx.Request(
            method,
            self._base_url + path,
            params=dict(params) if params else None,
            content=content,
            headers=headers,
            extensions={"timeout": self._timeout_within(time_cap).as_dict()},
        )
        with request_span(self._tracer, method, endpoint.template, attempt) as span:
            try:
                async with _answer(self._transport, request) as response:
                    status_label = str(response.status_code)
                    data = await self._read_capped(response, method, path)
                    if not response.is_success:
                        error = api_error(
                            method=method,
                            path=path,
                            status=response.status_code,
                            reason=response.reason_phrase,
                            body=data,
                            secrets=[bearer, *self._secrets],
                            retry_after=_retry_after_seconds(response.headers),
                        )
                        mark_span_status(span, response.status_code, error.error)
                        raise error
                    mark_span_status(span, response.status_code)
                    return WireResponse(method, path, response.status_code, data)
            except ThunderResponseError as exc:
                mark_span_status(span, None, exc.problem)
                raise
            except httpx.DecodingError as exc:
                mark_span_status(span, None, "undecodable body")
                raise ThunderResponseError(
                    method=method, path=path, status=None, problem=f"cannot decode body: {exc}"
                ) from exc
            except httpx.RequestError as exc:
                mark_span_status(span, None, type(exc).__name__)
                raise ThunderTransportError(
                    method=method,
                    path=path,
                    reason=f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
                    request_sent=not isinstance(exc, _UNSENT_ERRORS),
                    timed_out=isinstance(exc, httpx.TimeoutException),
                ) from exc
            finally:
                labels = (method, endpoint.template)
                self._metrics.requests.labels(*labels, status_label).inc()
                self._metrics.latency.labels(*labels).observe(time.perf_counter() - started)

    async def _read_capped(self, response: httpx.Response, method: str, path: str) -> bytes:
        limit = self._max_response_bytes
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ThunderResponseError(
                method=method,
                path=path,
                status=response.status_code,
                problem=f"body of {declared} bytes exceeds the {limit}-byte limit",
            )
        buffer = bytearray()
        async for chunk in response.aiter_bytes():
            buffer += chunk
            if len(buffer) > limit:
                raise ThunderResponseError(
                    method=method,
                    path=path,
                    status=response.status_code,
                    problem=f"body exceeds the {limit}-byte limit",
                )
        return bytes(buffer)
