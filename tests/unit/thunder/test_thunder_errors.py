"""The error hierarchy and the contract's message rules."""

from __future__ import annotations

import pytest

from thunder_dra.thunder import (
    BadRequest,
    Conflict,
    Forbidden,
    Gone,
    NotFound,
    RateLimited,
    Secret,
    ServerError,
    ThunderAPIError,
    ThunderError,
    ThunderResponseError,
    ThunderTransportError,
    Unauthorized,
)
from thunder_dra.thunder.errors import api_error, error_class_for


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, BadRequest),
        (401, Unauthorized),
        (403, Forbidden),
        (404, NotFound),
        (405, BadRequest),
        (409, Conflict),
        (410, Gone),
        (422, BadRequest),
        (429, RateLimited),
        (500, ServerError),
        (503, ServerError),
        (599, ServerError),
        (302, ThunderAPIError),
    ],
)
def test_error_class_by_status(status: int, expected: type[ThunderAPIError]) -> None:
    assert error_class_for(status) is expected
    assert issubclass(expected, ThunderError)


def test_hierarchy() -> None:
    for cls in (ThunderAPIError, ThunderTransportError, ThunderResponseError):
        assert issubclass(cls, ThunderError)


def _error(body: bytes, status: int = 403, reason: str = "") -> ThunderAPIError:
    return api_error(
        method="POST",
        path="/api/v1/enrollment-tokens/enroll",
        status=status,
        reason=reason,
        body=body,
        secrets=[Secret("tr_the-secret-token")],
    )


def test_message_names_method_path_status_error_and_message() -> None:
    error = _error(b'{"error":"Conflict","message":"zone already exists"}', 409)
    text = str(error)
    for part in ("POST", "/api/v1/enrollment-tokens/enroll", "409", "Conflict", "zone already"):
        assert part in text
    assert (error.error, error.message, error.status_text) == (
        "Conflict",
        "zone already exists",
        "Conflict",
    )


def test_error_falls_back_to_status_text_and_message_to_body() -> None:
    error = _error(b'{"error":"enrollment token already used"}')
    assert error.error == "enrollment token already used"
    assert "enrollment token already used" in str(error)
    assert error.message == '{"error":"enrollment token already used"}'

    plain = _error(b"upstream exploded " + b"x" * 500, 502, "Bad Gateway")
    assert plain.error == "Bad Gateway"
    assert plain.message.startswith("upstream exploded")
    assert len(plain.message) <= 200


def test_server_reason_phrase_wins_over_the_standard_one() -> None:
    assert _error(b"", 403, "Go Away").status_text == "Go Away"
    assert _error(b"", 403).status_text == "Forbidden"


def test_echoed_token_is_scrubbed_even_at_the_cut() -> None:
    secret = "tr_the-secret-token"
    for body in (
        f'{{"error":"bad {secret}","message":"{secret}"}}'.encode(),
        b"x" * 190 + secret.encode(),
    ):
        error = _error(body)
        assert secret not in str(error)
        assert secret[:8] not in str(error)


def test_transport_and_response_error_messages() -> None:
    unsent = ThunderTransportError(
        method="GET",
        path="/api/v1/zones",
        reason="ConnectError",
        request_sent=False,
        timed_out=False,
    )
    assert "never left the node" in str(unsent)
    sent = ThunderTransportError(
        method="GET", path="/api/v1/zones", reason="ReadTimeout", request_sent=True, timed_out=True
    )
    assert "may have reached" in str(sent)
    response = ThunderResponseError(
        method="GET", path="/api/v1/zones", status=200, problem="field 'zones': Field required"
    )
    assert "GET /api/v1/zones" in str(response)
    assert "zones" in str(response)
    assert response.created_id is None
