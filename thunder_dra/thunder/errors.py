"""The one exception hierarchy of the Thunder client.

Every message names the request (method and path) and what went wrong; none ever holds
a token: callers build errors through :func:`api_error`, which scrubs the secrets the
request used from whatever the server sent back.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from http import HTTPStatus

from thunder_dra.thunder.redact import Secret, scrub

# The contract's bound on how much of an unparsable error body reaches a message.
ERROR_BODY_PREVIEW_BYTES = 200
_SCRUB_WINDOW_BYTES = 64 * 1024


class ThunderError(Exception):
    """Base of every error raised by ``thunder_dra.thunder``."""


class ThunderAPIError(ThunderError):
    """Thunder answered with a non-2xx status."""

    def __init__(
        self,
        *,
        method: str,
        path: str,
        status: int,
        status_text: str,
        error: str,
        message: str,
        retry_after: float | None = None,
    ) -> None:
        self.method = method
        self.path = path
        self.status = status
        self.status_text = status_text
        self.error = error
        self.message = message
        self.retry_after = retry_after
        super().__init__(
            f"Thunder API {method} {path} failed: {status} {status_text}"
            f" (error: {error or '-'}; message: {message or '-'})"
        )


class BadRequest(ThunderAPIError):
    """A 4xx without a class of its own (400, 405, 422, ...): the request was wrong."""


class Unauthorized(ThunderAPIError):
    """401: the credential is missing or unknown."""


class Forbidden(ThunderAPIError):
    """403: the credential is known but not allowed (or the enrollment token is spent)."""


class NotFound(ThunderAPIError):
    """404."""


class Conflict(ThunderAPIError):
    """409."""


class Gone(ThunderAPIError):
    """410."""


class RateLimited(ThunderAPIError):
    """429: retried with backoff where the call allows it."""


class ServerError(ThunderAPIError):
    """5xx."""


class ThunderTransportError(ThunderError):
    """The request failed below HTTP: DNS, connect, TLS, timeout, a dropped connection."""

    def __init__(
        self, *, method: str, path: str, reason: str, request_sent: bool, timed_out: bool
    ) -> None:
        self.method = method
        self.path = path
        self.reason = reason
        # False only when the request provably never left the node (see retry.py).
        self.request_sent = request_sent
        self.timed_out = timed_out
        where = "may have reached Thunder" if request_sent else "never left the node"
        super().__init__(f"Thunder API {method} {path} failed in transport ({where}): {reason}")


class ThunderResponseError(ThunderError):
    """A 2xx answer that cannot be used: malformed JSON, missing fields, an oversized body."""

    def __init__(self, *, method: str, path: str, status: int | None, problem: str) -> None:
        self.method = method
        self.path = path
        self.status = status
        self.problem = problem
        # The ID of what Thunder created despite the unusable answer (a mint's
        # enrollmentTokenId), so the caller can still revoke it.
        self.created_id: str | None = None
        answered = f" (status {status})" if status is not None else ""
        super().__init__(f"Thunder API {method} {path}{answered}: unusable response: {problem}")


class ArtifactError(ThunderError):
    """An installer or library could not be fetched, parsed or verified."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        # The HTTP status when the artifact host answered with something other than 200.
        self.status = status
        super().__init__(message)


class ArtifactDigestMismatch(ArtifactError):
    """The downloaded library's SHA-256 differs from the pinned digest."""


_BY_STATUS: dict[int, type[ThunderAPIError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    429: RateLimited,
}


def error_class_for(status: int) -> type[ThunderAPIError]:
    """The exception class the client raises for a non-2xx ``status``."""
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if 500 <= status <= 599:
        return ServerError
    if 400 <= status <= 499:
        return BadRequest
    return ThunderAPIError


def status_text_of(status: int, reason: str = "") -> str:
    """The reason phrase the server sent, else the standard one for ``status``."""
    if reason:
        return reason
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown Status"


def api_error(
    *,
    method: str,
    path: str,
    status: int,
    reason: str,
    body: bytes,
    secrets: Iterable[Secret | str | None],
    retry_after: float | None = None,
) -> ThunderAPIError:
    """Build the API error for a non-2xx answer, following the contract's message rules.

    ``error`` comes from the body's ``error`` field, else the status text; ``message`` from
    the body's ``message`` field, else the first 200 bytes of the body.
    """
    secret_list = list(secrets)
    status_text = status_text_of(status, reason)
    error_field: str | None = None
    message_field: str | None = None
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        if isinstance(parsed.get("error"), str) and parsed["error"]:
            error_field = parsed["error"]
        if isinstance(parsed.get("message"), str) and parsed["message"]:
            message_field = parsed["message"]
    if message_field is None:
        # Scrub before cutting, so a token straddling the cut cannot leave a readable prefix.
        head = body[:_SCRUB_WINDOW_BYTES].decode("utf-8", errors="replace")
        message = scrub(head, secret_list)[:ERROR_BODY_PREVIEW_BYTES].strip()
    else:
        message = scrub(message_field, secret_list)
    return error_class_for(status)(
        method=method,
        path=path,
        status=status,
        status_text=status_text,
        error=scrub(error_field or status_text, secret_list),
        message=message,
        retry_after=retry_after,
    )
