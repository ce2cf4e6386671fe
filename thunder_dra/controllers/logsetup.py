"""Structured logging for the operator: one JSON object per line, or readable text on a TTY.

Fields passed through `extra=` (zone, pool, claim, ...) become keys of the JSON object,
so a log pipeline can filter on them. Secrets never reach a log record in the first
place (the API token lives in a `Secret` wrapper that prints as a mask); this module
adds no redaction of its own.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Final, TextIO

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRIBUTES: Final = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)


_KOPF_NOISE: Final = frozenset({"settings", "k8s_skip"})


def _jsonable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    return str(value)


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The `extra=` fields of a record.

    kopf's object loggers attach their whole settings object and a `k8s_ref`; the
    settings are dropped and the reference becomes `object` (kind/namespace/name).
    """
    fields: dict[str, Any] = {}
    for key, value in vars(record).items():
        if key in _STANDARD_ATTRIBUTES or key.startswith("_") or key in _KOPF_NOISE:
            continue
        if key == "k8s_ref" and isinstance(value, dict):
            parts = (value.get("kind"), value.get("namespace"), value.get("name"))
            fields["object"] = "/".join(str(part) for part in parts if part)
            continue
        fields[key] = _jsonable(value)
    return fields


class JsonFormatter(logging.Formatter):
    """`{"time", "level", "logger", "message", **fields}`, one line per record."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(record_fields(record))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, separators=(",", ":"), default=str)


class TextFormatter(logging.Formatter):
    """`time level logger: message key=value ...` for people at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        fields = " ".join(f"{key}={value}" for key, value in record_fields(record).items())
        line = f"{when} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if fields:
            line += f" [{fields}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(level: str, log_format: str, stream: TextIO | None = None) -> None:
    """Route every logger (ours, kopf's, aiohttp's) to one handler on stderr."""
    out = stream if stream is not None else sys.stderr
    use_json = log_format == "json" or (log_format == "auto" and not out.isatty())
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Each request of these (and kopf's line per handled watch event) is noise at info;
    # their warnings still come through.
    for noisy in ("aiohttp.access", "urllib3", "httpx", "httpcore", "kopf.objects"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
