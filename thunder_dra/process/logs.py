"""Structured logs for both processes: one JSON object per line, or readable text on a TTY.

Every line has the same schema, whichever process wrote it:

    {"time": "2026-12-01T12:00:00.123+00:00", "level": "info", "logger": "thunder_dra...",
     "message": "...", <fields>, "trace_id": "...", "span_id": "...", "exception": "..."}

- `time` is UTC with milliseconds, `level` lower case, `logger` the logger's name;
- the fields passed as `extra={...}` (`claim_uid`, `zone`, `pool`, ...) follow as
  top-level keys; they never replace the four keys above;
- `trace_id` and `span_id` (hex) appear while an OpenTelemetry span is active;
- `exception` (the formatted traceback) and `stack` appear only when the record has one.

kopf's object loggers attach their settings and a `k8s_ref`; the settings are dropped
and the reference becomes `object` (`kind/namespace/name`).

`SecretScrubber` is the last line of defence against a leaked secret: every secret
registered with it (the Thunder API token, each enrollment token while it is in memory)
is replaced by the mask in the message, the arguments, every field (nested too) and the
exception text of every record the handler sees. No code path is meant to log a
secret in the first place.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import traceback
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final, TextIO

from opentelemetry import trace

from thunder_dra.thunder import MASK, Secret

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD: Final = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)).keys() | {"message", "asctime"}
)
# Keys of the schema itself: a field of the same name cannot replace them.
SCHEMA_KEYS: Final = ("time", "level", "logger", "message")
# kopf attaches these to every record of its object loggers; neither is worth a field.
_KOPF_NOISE: Final = frozenset({"settings", "k8s_skip"})
# Libraries that log a line per request or watch event (URLs, never bodies) stay at warning.
_NOISY_LOGGERS: Final = (
    "aiohttp.access",
    "urllib3",
    "httpx",
    "httpcore",
    "kubernetes",
    "grpc",
    "kopf.objects",
)

# Shorter values would mangle unrelated text and protect nothing.
MIN_SECRET_LENGTH: Final = 4
_MASK_CHARACTERS: Final = frozenset(MASK)


def _jsonable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item) for key, item in value.items()}
    return str(value)


class SecretScrubber(logging.Filter):
    """Masks registered secret values wherever they appear in a record."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._by_key: dict[int, tuple[str, ...]] = {}
        self._next_key = 1
        # Read without the lock on every record; replaced whole under it.
        self._values: tuple[str, ...] = ()

    def add(self, secret: Secret | str) -> int:
        """Mask `secret` from now on; returns the key `remove` takes.

        Values shorter than four characters, or made only of the mask's own characters,
        are not masked (they would mangle unrelated text, or never stop matching).
        """
        value = secret.reveal() if isinstance(secret, Secret) else secret
        variants = tuple(
            each
            for each in dict.fromkeys((value, value.strip()))
            if len(each) >= MIN_SECRET_LENGTH and not set(each) <= _MASK_CHARACTERS
        )
        with self._lock:
            key = self._next_key
            self._next_key += 1
            if variants:
                self._by_key[key] = variants
                self._refresh()
        return key

    def remove(self, key: int) -> None:
        with self._lock:
            if self._by_key.pop(key, None) is not None:
                self._refresh()

    def _refresh(self) -> None:
        values = {value for variants in self._by_key.values() for value in variants}
        # Longest first, so a secret that contains another is masked whole.
        self._values = tuple(sorted(values, key=len, reverse=True))

    @property
    def active(self) -> bool:
        return bool(self._values)

    def scrub(self, text: str) -> str:
        """`text` with every registered secret replaced by the mask.

        Repeated until none is left: masking one occurrence can join its neighbours into
        another. Each pass removes at least one character that is not in the mask, so
        this ends.
        """
        values = self._values
        changed = True
        while changed:
            changed = False
            for value in values:
                if value in text:
                    text = text.replace(value, MASK)
                    changed = True
        return text

    def scrub_value(self, value: Any) -> Any:
        """A JSON-ready copy of `value` with every string (keys too) scrubbed."""
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, int | float | bool) or value is None:
            return value
        if isinstance(value, list | tuple | set | frozenset):
            return [self.scrub_value(item) for item in value]
        if isinstance(value, Mapping):
            return {self.scrub(str(key)): self.scrub_value(item) for key, item in value.items()}
        return self.scrub(str(value))

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._values:
            return True
        record.msg, record.args = self.scrub(_message(record)), None
        for key, value in list(vars(record).items()):
            if key in _STANDARD or key in _KOPF_NOISE or key.startswith("_"):
                continue
            setattr(record, key, self.scrub_value(value))
        if record.exc_info and record.exc_info[0] is not None:
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
            record.exc_info = None
        if record.exc_text:
            record.exc_text = self.scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = self.scrub(record.stack_info)
        return True


def _message(record: logging.LogRecord) -> str:
    try:
        return record.getMessage()
    except Exception:
        return f"{record.msg!s} (arguments {record.args!r} do not fit its placeholders)"


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The `extra=` fields of a record, JSON-ready."""
    fields: dict[str, Any] = {}
    for key, value in vars(record).items():
        if key in _STANDARD or key in _KOPF_NOISE or key.startswith("_"):
            continue
        if key == "k8s_ref" and isinstance(value, Mapping):
            parts = (value.get("kind"), value.get("namespace"), value.get("name"))
            fields["object"] = "/".join(str(part) for part in parts if part)
            continue
        fields[key] = _jsonable(value)
    return fields


def _trace_fields() -> dict[str, str]:
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {
        "trace_id": format(context.trace_id, "032x"),
        "span_id": format(context.span_id, "016x"),
    }


def _exception_text(formatter: logging.Formatter, record: logging.LogRecord) -> str | None:
    if record.exc_text:
        return record.exc_text
    if record.exc_info and record.exc_info[0] is not None:
        return formatter.formatException(record.exc_info)
    return None


def log_document(formatter: logging.Formatter, record: logging.LogRecord) -> dict[str, Any]:
    """The JSON object of one record, in the schema above."""
    document: dict[str, Any] = {
        "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
        "level": record.levelname.lower(),
        "logger": record.name,
        "message": _message(record),
    }
    for key, value in record_fields(record).items():
        document.setdefault(key, value)
    for key, value in _trace_fields().items():
        document.setdefault(key, value)
    exception = _exception_text(formatter, record)
    if exception:
        document["exception"] = exception
    if record.stack_info:
        document["stack"] = record.stack_info
    return document


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line; every string scrubbed once more."""

    def __init__(self, scrubber: SecretScrubber | None = None) -> None:
        super().__init__()
        self._scrubber = scrubber

    def format(self, record: logging.LogRecord) -> str:
        document = log_document(self, record)
        if self._scrubber is not None and self._scrubber.active:
            document = self._scrubber.scrub_value(document)
        return json.dumps(document, separators=(",", ":"), default=str)


class TextFormatter(logging.Formatter):
    """`HH:MM:SS.mmm LEVEL logger: message key=value ...` for people at a terminal."""

    def __init__(self, scrubber: SecretScrubber | None = None) -> None:
        super().__init__()
        self._scrubber = scrubber

    def format(self, record: logging.LogRecord) -> str:
        document = log_document(self, record)
        stamp = datetime.fromtimestamp(record.created).strftime("%H:%M:%S.%f")[:-3]
        line = f"{stamp} {record.levelname:<7} {record.name}: {document['message']}"
        extras = {
            key: value
            for key, value in document.items()
            if key not in SCHEMA_KEYS and key not in ("exception", "stack")
        }
        if extras:
            line += " " + " ".join(f"{key}={value}" for key, value in extras.items())
        for key in ("exception", "stack"):
            if key in document:
                line += "\n" + str(document[key])
        # Joining fields can line up a secret across their boundaries.
        return self._scrubber.scrub(line) if self._scrubber is not None else line


def configure_logging(
    level: str,
    log_format: str,
    stream: TextIO | None = None,
    scrubber: SecretScrubber | None = None,
) -> SecretScrubber:
    """Route every logger to one handler on `stream` (stderr); return its scrubber.

    `log_format` is `json`, `text`, or `auto` (JSON unless the stream is a terminal).
    The scrubber (`SECRETS` unless given) sees every record before it is written.
    """
    out = stream if stream is not None else sys.stderr
    use_json = log_format == "json" or (log_format == "auto" and not out.isatty())
    scrubber = scrubber if scrubber is not None else SECRETS
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter(scrubber) if use_json else TextFormatter(scrubber))
    handler.addFilter(scrubber)
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for noisy in _NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    return scrubber


# The process's scrubber: `configure_logging` attaches it; code that holds a secret
# registers it here (the daemon passes it explicitly, the operator's Thunder clients
# register their token).
SECRETS: Final = SecretScrubber()
