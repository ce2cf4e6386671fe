"""Transport-neutral requests and responses of the fake Thunder service.

The service handles these plain objects; ``service.py`` adapts them to ``httpx`` (in-process)
and ``server.py`` to aiohttp (as a process), so both paths run the same code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any


class HttpError(Exception):
    """Raised by handlers to answer with an error status and a contract-shaped body."""

    def __init__(self, status: int, error: str, message: str | None = None) -> None:
        self.status = status
        self.error = error
        self.message = message
        super().__init__(f"{status} {error}: {message or ''}")

    def response(self) -> FakeResponse:
        body: dict[str, Any] = {"error": self.error}
        if self.message is not None:
            body["message"] = self.message
        return json_response(self.status, body)


@dataclass(frozen=True)
class FakeRequest:
    method: str
    path: str
    query: dict[str, str]
    # Lower-cased header names.
    headers: dict[str, str]
    body: bytes
    # scheme://host[:port] as the caller addressed the service; the installer points here.
    base_url: str

    def json(self, *, required: bool = True) -> dict[str, Any]:
        """The body as a JSON object; an empty body is ``{}`` unless ``required``."""
        if not self.body.strip():
            if required:
                raise HttpError(400, "BadRequest", "a JSON object body is required")
            return {}
        try:
            parsed = json.loads(self.body)
        except ValueError:
            raise HttpError(400, "BadRequest", "body is not valid JSON") from None
        if not isinstance(parsed, dict):
            raise HttpError(400, "BadRequest", "body must be a JSON object")
        return parsed

    def bearer(self) -> str | None:
        """The bearer credential, whitespace-stripped; None when absent or not Bearer."""
        value = self.headers.get("authorization", "")
        scheme, _, credential = value.strip().partition(" ")
        if scheme.lower() != "bearer" or not credential.strip():
            return None
        return credential.strip()

    def body_for_log(self) -> Any:
        if not self.body:
            return None
        try:
            return json.loads(self.body)
        except ValueError:
            return self.body[:1024].decode("utf-8", errors="replace")


@dataclass
class FakeResponse:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def reason(self) -> str:
        try:
            return HTTPStatus(self.status).phrase
        except ValueError:
            return ""


def json_response(status: int, payload: Any) -> FakeResponse:
    return FakeResponse(
        status,
        json.dumps(payload, separators=(",", ":")).encode(),
        {"Content-Type": "application/json"},
    )


def no_content() -> FakeResponse:
    return FakeResponse(204)


def error_body_for(status: int) -> dict[str, str]:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    return {"error": phrase, "message": "injected fault"}
