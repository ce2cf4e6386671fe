"""The failures of a Kubernetes API call, one class per kind a caller handles differently.

Every error carries the request's ``method`` and ``path``, the HTTP ``status`` (None when
no answer came), the apiserver's ``reason`` (its Status reason, e.g. ``AlreadyExists``;
for a call without an answer, the kind of failure) and its ``message``. None of them
holds a request body, a header or an answer's data, so a token or a Secret's contents
never reach a log line through an error.

========================  ==========================================  ===========
class                     raised for                                  retryable
========================  ==========================================  ===========
:class:`NotFound`         404                                         no
:class:`Conflict`         409 (a changed resourceVersion, or the      no
                          object already exists: ``reason``
                          ``AlreadyExists``)
:class:`Gone`             410 (an expired ``continue`` token or       no (relist)
                          resourceVersion)
:class:`Forbidden`        401 and 403                                 no
:class:`Invalid`          400 and 422                                 no
:class:`Unavailable`      5xx, 429, a refused or reset connection     yes
:class:`Timeout`          no complete answer within the call's        yes
                          timeout (a kind of :class:`Unavailable`)
:class:`KubeError`        any other status (405, 415, ...)            no
========================  ==========================================  ===========
"""

from __future__ import annotations

import json
import re
from typing import ClassVar, Final

MESSAGE_LIMIT: Final = 500
"""Longest apiserver message kept on an error."""

_INVALID_VALUE = re.compile(r'Invalid value: ("(?:[^"\\]|\\.)*"|\S+)')


class KubeError(Exception):
    """A Kubernetes API call failed."""

    retryable: ClassVar[bool] = False
    """Whether the same call may succeed if sent again later."""

    def __init__(
        self, method: str, path: str, status: int | None, reason: str, message: str = ""
    ) -> None:
        self.method = method
        self.path = path
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(method, path, status, reason, message)

    def __str__(self) -> str:
        answer = str(self.status) if self.status is not None else "no answer"
        text = f"{self.method} {self.path}: {answer} {self.reason}".rstrip()
        return f"{text}: {self.message}" if self.message else text

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"


class NotFound(KubeError):
    """404: the object (or its namespace, or its API) does not exist."""


class Conflict(KubeError):
    """409: the object changed since it was read, or one of that name already exists."""

    @property
    def already_exists(self) -> bool:
        return self.reason == "AlreadyExists"


class Gone(KubeError):
    """410: a ``continue`` token or resourceVersion expired; start the list again."""


class Forbidden(KubeError):
    """401 or 403: the credentials are refused, or RBAC or an admission policy said no."""


class Invalid(KubeError):
    """400 or 422: the request or the object was refused as malformed or invalid."""


class Unavailable(KubeError):
    """5xx, 429, or no answer: the apiserver is overloaded, restarting or unreachable."""

    retryable = True


class Timeout(Unavailable):
    """No complete answer within the call's timeout."""


_BY_STATUS: Final[dict[int, type[KubeError]]] = {
    400: Invalid,
    401: Forbidden,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: Unavailable,
    504: Timeout,
}


def error_class(status: int) -> type[KubeError]:
    """The error class for an HTTP status outside 2xx."""
    found = _BY_STATUS.get(status)
    if found is not None:
        return found
    return Unavailable if status >= 500 else KubeError


def from_answer(method: str, path: str, status: int, http_reason: str, body: bytes) -> KubeError:
    """The error for an answer outside 2xx, from the Status object the apiserver sent.

    For Secrets, the values the apiserver echoes after ``Invalid value:`` are dropped:
    they may be the Secret's data.
    """
    reason, message = "", ""
    try:
        decoded = json.loads(body) if body else None
    except ValueError:
        decoded = None
        message = body.decode("utf-8", "replace")
    if isinstance(decoded, dict):
        reason = str(decoded.get("reason") or "")
        message = str(decoded.get("message") or "")
    elif decoded is not None:
        message = str(decoded)
    if "/secrets" in path:
        message = _INVALID_VALUE.sub("Invalid value: (withheld)", message)
    if len(message) > MESSAGE_LIMIT:
        message = message[: MESSAGE_LIMIT - 3] + "..."
    return error_class(status)(method, path, status, reason or http_reason, message)
