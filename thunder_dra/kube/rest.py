"""One raw JSON request through the official client's ``ApiClient``.

Authentication, TLS, proxies and service-account token refresh stay the client's;
paths, bodies and answers stay plain JSON, so every resource (``resource.k8s.io/v1``,
the project's CRDs, subresources) is handled the same way. Callers map errors to
their own types.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kubernetes import client as k8s


def send(
    api: k8s.ApiClient,
    method: str,
    path: str,
    *,
    query: Sequence[tuple[str, str]] = (),
    body: Any = None,
    content_type: str | None = None,
    timeout: float | tuple[float, float],
) -> Any:
    """Send a request and read its answer; raises ``ApiException`` as the client does.

    The returned response has ``.status``, ``.reason`` and ``.data`` (bytes, read).
    """
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type or "application/json"
    request = api.param_serialize(
        method=method,
        resource_path=path,
        query_params=list(query),
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*request, _request_timeout=timeout)
    response.read()  # type: ignore[no-untyped-call]
    return response
