"""An OTLP trace receiver for tests: what a collector would get from the operator and daemon.

It serves both OTLP transports the processes can export with, on one host:

- OTLP/gRPC: the ``TraceService/Export`` RPC (``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``);
- OTLP/HTTP: ``POST /v1/traces`` with an ``application/x-protobuf`` body, gzip or not
  (``http/protobuf``).

Each ``ExportTraceServiceRequest`` is decoded with the official ``opentelemetry-proto``
messages and every span kept as a :class:`ReceivedSpan`, for a test to query::

    with OtlpReceiver() as receiver:        # 127.0.0.1, ephemeral ports
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.grpc_endpoint
        ...
        spans = receiver.wait_for(lambda s: any(x.name == "..." for x in s), timeout=30)

``host`` binds another address (a test bridge a real node reaches) instead of loopback.
"""

from __future__ import annotations

import gzip
import http.server
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span, Status

PROTOBUF = "application/x-protobuf"
TRACES_PATH = "/v1/traces"
_MAX_BODY = 64 * 1024 * 1024

AttributeValue = str | bool | int | float | bytes | list[Any] | dict[str, Any] | None


@dataclass(frozen=True)
class ReceivedEvent:
    name: str
    attributes: Mapping[str, AttributeValue]


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the receiver decoded it; IDs in lowercase hex, ``parent_id`` None for a
    root span."""

    transport: str  # "grpc" or "http"
    service_name: str
    resource: Mapping[str, AttributeValue]
    scope: str
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    kind: str  # "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER", "UNSPECIFIED"
    attributes: Mapping[str, AttributeValue]
    events: tuple[ReceivedEvent, ...]
    status_code: str  # "UNSET", "OK", "ERROR"
    status_message: str
    start_ns: int
    end_ns: int
    links: tuple[tuple[str, str], ...] = field(default=())

    def texts(self) -> Iterator[str]:
        """Every string this span carries: names, attribute keys and values, events,
        status and resource, for a test that looks for what must not be there."""
        yield self.name
        yield self.scope
        yield self.status_message
        for attributes in (self.attributes, self.resource):
            yield from _texts(attributes)
        for event in self.events:
            yield event.name
            yield from _texts(event.attributes)


def _texts(value: Any) -> Iterator[str]:
    if isinstance(value, Mapping):
        for key, inner in value.items():
            yield str(key)
            yield from _texts(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _texts(inner)
    elif isinstance(value, bytes):
        yield value.decode("utf-8", "replace")
    elif value is not None:
        yield str(value)


def _value(any_value: AnyValue) -> AttributeValue:
    which = any_value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    if which == "kvlist_value":
        return _attributes(any_value.kvlist_value.values)
    found: AttributeValue = getattr(any_value, which)
    return found


def _attributes(pairs: Sequence[KeyValue]) -> dict[str, AttributeValue]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _kind(span: Span) -> str:
    return Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_")


def _status(status: Status) -> str:
    return Status.StatusCode.Name(status.code).removeprefix("STATUS_CODE_")


def decode(
    request: trace_service_pb2.ExportTraceServiceRequest, transport: str
) -> list[ReceivedSpan]:
    """The spans of one export request."""
    found = []
    resource_spans: ResourceSpans
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        service = resource.get("service.name")
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                found.append(
                    ReceivedSpan(
                        transport=transport,
                        service_name=service if isinstance(service, str) else "",
                        resource=resource,
                        scope=scope_spans.scope.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex() or None,
                        name=span.name,
                        kind=_kind(span),
                        attributes=_attributes(span.attributes),
                        events=tuple(
                            ReceivedEvent(e.name, _attributes(e.attributes)) for e in span.events
                        ),
                        status_code=_status(span.status),
                        status_message=span.status.message,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        links=tuple(
                            (link.trace_id.hex(), link.span_id.hex()) for link in span.links
                        ),
                    )
                )
    return found


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, keep: Callable[[list[ReceivedSpan]], None]) -> None:
        self._keep = keep

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self._keep(decode(request, "grpc"))
        return trace_service_pb2.ExportTraceServiceResponse()


class _HttpHandler(http.server.BaseHTTPRequestHandler):
    server: _HttpServer

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != TRACES_PATH:
            self._answer(404, b"not found", "text/plain")
            return
        media = self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        if media != PROTOBUF:
            self._answer(415, f"only {PROTOBUF}".encode(), "text/plain")
            return
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 <= length <= _MAX_BODY:
            self._answer(413, b"too large", "text/plain")
            return
        body = self.rfile.read(length)
        if self.headers.get("Content-Encoding", "").lower() == "gzip":
            body = gzip.decompress(body)
        request = trace_service_pb2.ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except Exception as err:  # a malformed body: the client's fault
            self._answer(
                400, f"undecodable ExportTraceServiceRequest: {err}".encode(), "text/plain"
            )
            return
        self.server.keep(decode(request, "http"))
        self._answer(
            200, trace_service_pb2.ExportTraceServiceResponse().SerializeToString(), PROTOBUF
        )

    def _answer(self, status: int, body: bytes, media: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", media)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return  # quiet: a test's output is its own


class _HttpServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], keep: Callable[[list[ReceivedSpan]], None]):
        self.keep = keep
        super().__init__(address, _HttpHandler)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class OtlpReceiver:
    """OTLP/gRPC and OTLP/HTTP on ``host``; ``grpc_port``/``http_port`` 0 pick free ports."""

    def __init__(self, host: str = "127.0.0.1", *, grpc_port: int = 0, http_port: int = 0) -> None:
        self.host = host
        self._grpc_port = grpc_port
        self._http_port = http_port
        self._spans: list[ReceivedSpan] = []
        self._changed = threading.Condition()
        self._grpc: grpc.Server | None = None
        self._http: _HttpServer | None = None
        self._http_thread: threading.Thread | None = None

    # -- serving ---------------------------------------------------------------------

    def start(self) -> OtlpReceiver:
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _TraceService(self._keep), self._grpc
        )
        bound = self._grpc.add_insecure_port(f"{_url_host(self.host)}:{self._grpc_port}")
        if bound == 0:
            raise OSError(f"cannot bind OTLP/gRPC on {self.host}:{self._grpc_port}")
        self._grpc_port = bound
        self._grpc.start()
        self._http = _HttpServer((self.host, self._http_port), self._keep)
        self._http_port = int(self._http.server_address[1])
        self._http_thread = threading.Thread(
            target=self._http.serve_forever, name="otlp-http", daemon=True
        )
        self._http_thread.start()
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._grpc is not None:
            self._grpc.stop(grace=1).wait()
            self._grpc = None

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def grpc_port(self) -> int:
        return self._grpc_port

    @property
    def http_port(self) -> int:
        return self._http_port

    @property
    def grpc_endpoint(self) -> str:
        """``OTEL_EXPORTER_OTLP_ENDPOINT`` for ``grpc`` (plain text: ``http://``)."""
        return f"http://{_url_host(self.host)}:{self._grpc_port}"

    @property
    def http_endpoint(self) -> str:
        """``OTEL_EXPORTER_OTLP_ENDPOINT`` for ``http/protobuf`` (the exporter adds
        ``/v1/traces``)."""
        return f"http://{_url_host(self.host)}:{self._http_port}"

    @property
    def http_traces_url(self) -> str:
        """``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` for ``http/protobuf``: the full URL."""
        return self.http_endpoint + TRACES_PATH

    # -- what arrived ----------------------------------------------------------------

    def _keep(self, spans: list[ReceivedSpan]) -> None:
        with self._changed:
            self._spans.extend(spans)
            self._changed.notify_all()

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far, in the order it arrived."""
        with self._changed:
            return list(self._spans)

    def clear(self) -> None:
        with self._changed:
            self._spans.clear()

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        """The spans received of one trace."""
        return [s for s in self.spans() if s.trace_id == trace_id]

    def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 30.0
    ) -> list[ReceivedSpan]:
        """The spans received, once ``predicate`` holds for them; AssertionError (naming
        the spans there are) when it does not within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(list(self._spans)):
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted({(s.service_name, s.name) for s in self._spans})
                    raise AssertionError(
                        f"the spans received ({len(self._spans)}) never matched within "
                        f"{timeout} s; received: {names}"
                    )
                self._changed.wait(left)
            return list(self._spans)


def tree(spans: Sequence[ReceivedSpan], *, timed: bool = False) -> list[str]:
    """The spans of one trace as an indented parent/child outline, children by start time;
    a span whose parent is not among ``spans`` is shown at the top. ``timed`` adds each
    span's start (from the trace's first) and duration, in milliseconds."""
    ids = {s.span_id for s in spans}
    children: dict[str | None, list[ReceivedSpan]] = {}
    for span in spans:
        parent = span.parent_id if span.parent_id in ids else None
        children.setdefault(parent, []).append(span)
    lines: list[str] = []
    first = min((s.start_ns for s in spans), default=0)

    def walk(parent: str | None, depth: int) -> None:
        for span in sorted(children.get(parent, []), key=lambda s: (s.start_ns, s.name)):
            when = ""
            if timed:
                start, took = (span.start_ns - first) / 1e6, (span.end_ns - span.start_ns) / 1e6
                when = f" at {start:.1f} ms, {took:.1f} ms"
            lines.append(f"{'  ' * depth}{span.name} [{span.kind}]{when}")
            walk(span.span_id, depth + 1)

    walk(None, 0)
    return lines
