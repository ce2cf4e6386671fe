"""Structured logs: one JSON object per line in a container, ``key=value`` text on a terminal.

Fields passed as ``extra={...}`` become top-level keys (``claim_uid``, ``namespace``,
``zone``...). A filter replaces every registered secret (the API token, and each
enrollment token while it exists in memory) with a mask in the message and in every
field, as a last line of defence: no code path is meant to log one in the first place.
"""

from __future__ import annotations

import itertools
import json
import logging
import sys
import threading
from datetime import UTC, datetime
from typing import Any, TextIO

from thunder_dra.thunder import MASK, Secret

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None))) | {
    "message",
    "asctime",
}
_MIN_SECRET = 4


class SecretScrubber(logging.Filter):
    """Masks registered secret values wherever they appear in a record."""

    def __init__(self) -> None:
        super().__init__()
        self._values: dict[int, str] = {}
        self._lock = threading.Lock()
        self._keys = itertools.count(1)

    def add(self, secret: Secret | str) -> int:
        """Mask ``secret`` from now on; returns the key that :meth:`remove` takes."""
        value = secret.reveal() if isinstance(secret, Secret) else secret
        key = next(self._keys)
        if len(value) >= _MIN_SECRET:
            with self._lock:
                self._values[key] = value
        return key

    def remove(self, key: int) -> None:
        with self._lock:
            self._values.pop(key, None)

    def scrub(self, text: str) -> str:
        with self._lock:
            values = list(self._values.values())
        for value in values:
            if value in text:
                text = text.replace(value, MASK)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        scrubbed = self.scrub(message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        for key, value in list(vars(record).items()):
            if key not in _STANDARD and isinstance(value, str):
                setattr(record, key, self.scrub(value))
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = self.scrub(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


def _jsonable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _fields(record).items():
            document.setdefault(key, _jsonable(value))
        if record.exc_text:
            document["exception"] = record.exc_text
        elif record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created).strftime("%H:%M:%S.%f")[:-3]
        parts = [f"{stamp} {record.levelname[:4]} {record.name}: {record.getMessage()}"]
        parts += [f"{k}={_jsonable(v)}" for k, v in _fields(record).items()]
        text = " ".join(parts)
        if record.exc_text:
            text += "\n" + record.exc_text
        elif record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure_logging(level: str, fmt: str, stream: TextIO | None = None) -> SecretScrubber:
    """Route every logger to ``stream`` (stderr) and return the scrubber to register secrets."""
    out = stream or sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter())
    scrubber = SecretScrubber()
    handler.addFilter(scrubber)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Libraries that log request lines (with URLs, never bodies) stay at warning.
    for noisy in ("httpx", "httpcore", "urllib3", "kubernetes", "aiohttp.access", "grpc"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return scrubber
