"""Short watch windows and versioned listings (KubeClient.watch_window and
list_with_version), through a transport that answers from a script: what is asked of the
apiserver, which events come back, the version to go on from, and each way it fails."""

from __future__ import annotations

import json
from typing import Any

import pytest

from thunder_dra.kube.client import KubeClient, Request, Response
from thunder_dra.kube.errors import Forbidden, Gone, KubeError, NotFound, Unavailable
from thunder_dra.kube.resources import RESOURCE_CLAIMS

pytestmark = pytest.mark.unit

CLAIMS = RESOURCE_CLAIMS.collection()


class ScriptedTransport:
    """Answers every request with the next scripted response and keeps the requests."""

    def __init__(self, *answers: Response) -> None:
        self.answers = list(answers)
        self.requests: list[Request] = []

    async def open(self) -> None:
        pass

    async def send(self, request: Request) -> Response:
        self.requests.append(request)
        return self.answers.pop(0)

    async def close(self) -> None:
        pass


def _claim(name: str, version: str) -> dict[str, Any]:
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": version}
    return {"kind": "ResourceClaim", "metadata": meta}


def _stream(*events: Any) -> Response:
    lines = [e if isinstance(e, str) else json.dumps(e) for e in events]
    return Response(200, "OK", ("\n".join(lines) + "\n").encode())


def _event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def _bookmark(version: str) -> dict[str, Any]:
    return _event("BOOKMARK", {"kind": "ResourceClaim", "metadata": {"resourceVersion": version}})


def _error(code: object, reason: str = "Expired", message: str = "too old") -> dict[str, Any]:
    return _event(
        "ERROR",
        {"kind": "Status", "status": "Failure", "code": code, "reason": reason, "message": message},
    )


async def test_a_window_asks_for_a_bounded_watch_from_the_version_with_bookmarks() -> None:
    transport = ScriptedTransport(_stream())
    kube = KubeClient(transport, timeout=7)
    await kube.watch_window(CLAIMS, resource_version="41", seconds=3)
    (request,) = transport.requests
    assert (request.method, request.path) == ("GET", CLAIMS)
    assert dict(request.query) == {
        "watch": "1",
        "resourceVersion": "41",
        "timeoutSeconds": "3",
        "allowWatchBookmarks": "true",
    }
    assert request.timeout > 3, "the client waits longer than the apiserver keeps the watch"


async def test_events_come_back_in_order_and_the_version_is_the_last_events() -> None:
    first, second, gone = _claim("a", "42"), _claim("b", "43"), _claim("a", "44")
    transport = ScriptedTransport(
        _stream(_event("ADDED", first), _event("MODIFIED", second), "", _event("DELETED", gone))
    )
    events, version = await KubeClient(transport).watch_window(CLAIMS, resource_version="41")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"),
        ("MODIFIED", "b"),
        ("DELETED", "a"),
    ]
    assert events[0]["object"] == first
    assert version == "44"


async def test_bookmarks_move_the_version_on_but_are_not_events() -> None:
    transport = ScriptedTransport(_stream(_event("ADDED", _claim("a", "42")), _bookmark("57")))
    events, version = await KubeClient(transport).watch_window(CLAIMS, resource_version="41")
    assert [e["type"] for e in events] == ["ADDED"]
    assert version == "57"


async def test_a_quiet_window_keeps_the_given_version() -> None:
    for body in (b"", b"\n\n"):
        transport = ScriptedTransport(Response(200, "OK", body))
        events, version = await KubeClient(transport).watch_window(CLAIMS, resource_version="41")
        assert (events, version) == ([], "41")


async def test_an_expired_version_raises_gone_so_the_caller_lists_again() -> None:
    transport = ScriptedTransport(_stream(_event("ADDED", _claim("a", "42")), _error(410)))
    with pytest.raises(Gone) as caught:
        await KubeClient(transport).watch_window(CLAIMS, resource_version="1")
    assert (caught.value.status, caught.value.reason) == (410, "Expired")
    assert caught.value.message == "too old"


@pytest.mark.parametrize(
    ("code", "error", "status"),
    [(403, Forbidden, 403), (404, NotFound, 404), (500, Unavailable, 500), ("x", Unavailable, 500)],
)
async def test_other_error_events_raise_their_error_class(
    code: object, error: type[KubeError], status: int
) -> None:
    transport = ScriptedTransport(_stream(_error(code, "Nope", "the apiserver says no")))
    with pytest.raises(error) as caught:
        await KubeClient(transport).watch_window(CLAIMS, resource_version="1")
    assert type(caught.value) is error
    assert (caught.value.path, caught.value.status) == (CLAIMS, status)
    assert caught.value.message == "the apiserver says no"


async def test_a_line_that_is_not_json_is_an_invalid_answer() -> None:
    transport = ScriptedTransport(_stream(_event("ADDED", _claim("a", "42")), "{not json"))
    with pytest.raises(KubeError) as caught:
        await KubeClient(transport).watch_window(CLAIMS, resource_version="1")
    assert type(caught.value) is KubeError
    assert caught.value.reason == "InvalidAnswer"
    assert caught.value.path == CLAIMS


async def test_events_without_an_object_are_skipped() -> None:
    transport = ScriptedTransport(
        _stream({"type": "ADDED"}, [1, 2], _event("MODIFIED", _claim("a", "42")))
    )
    events, version = await KubeClient(transport).watch_window(CLAIMS, resource_version="1")
    assert [e["type"] for e in events] == ["MODIFIED"]
    assert version == "42"


@pytest.mark.parametrize(
    ("status", "error"), [(410, Gone), (403, Forbidden), (503, Unavailable), (404, NotFound)]
)
async def test_an_answer_outside_2xx_raises(status: int, error: type[KubeError]) -> None:
    body = json.dumps({"kind": "Status", "reason": "Why", "message": "because"}).encode()
    transport = ScriptedTransport(Response(status, "Status", body))
    with pytest.raises(error) as caught:
        await KubeClient(transport).watch_window(CLAIMS, resource_version="1")
    assert (caught.value.status, caught.value.message) == (status, "because")


async def test_a_listing_returns_its_items_and_version() -> None:
    page = {"metadata": {"resourceVersion": "99"}, "items": [_claim("a", "42"), _claim("b", "7")]}
    transport = ScriptedTransport(Response(200, "OK", json.dumps(page).encode()))
    items, version = await KubeClient(transport).list_with_version(CLAIMS)
    assert [i["metadata"]["name"] for i in items] == ["a", "b"]
    assert version == "99"
    (request,) = transport.requests
    assert (request.method, request.path, request.query) == ("GET", CLAIMS, (("limit", "100"),))


def _page(version: str, token: str, *names: str) -> Response:
    page = {
        "metadata": {"resourceVersion": version, "continue": token},
        "items": [_claim(n, "1") for n in names],
    }
    return Response(200, "OK", json.dumps(page).encode())


async def test_a_listing_comes_a_page_at_a_time_and_keeps_the_first_pages_version() -> None:
    transport = ScriptedTransport(_page("99", "t1", "a", "b"), _page("99", "", "c"))
    items, version = await KubeClient(transport).list_with_version(CLAIMS, limit=2)
    assert [i["metadata"]["name"] for i in items] == ["a", "b", "c"]
    assert version == "99"
    assert [r.query for r in transport.requests] == [
        (("limit", "2"),),
        (("limit", "2"), ("continue", "t1")),
    ]


async def test_a_listing_whose_continue_token_expired_is_read_again_once() -> None:
    expired = Response(410, "Gone", json.dumps({"kind": "Status", "reason": "Expired"}).encode())
    transport = ScriptedTransport(
        _page("99", "t1", "a"), expired, _page("120", "t2", "a"), _page("120", "", "b")
    )
    items, version = await KubeClient(transport).list_with_version(CLAIMS, limit=1)
    assert ([i["metadata"]["name"] for i in items], version) == (["a", "b"], "120")
    transport = ScriptedTransport(_page("99", "t1", "a"), expired, _page("120", "t2", "a"), expired)
    with pytest.raises(Gone):
        await KubeClient(transport).list_with_version(CLAIMS, limit=1)


async def test_an_empty_listing_is_no_items() -> None:
    transport = ScriptedTransport(Response(200, "OK", b'{"metadata": {}, "items": null}'))
    assert await KubeClient(transport).list_with_version(CLAIMS) == ([], "")


async def test_a_failed_listing_raises() -> None:
    transport = ScriptedTransport(Response(503, "Service Unavailable", b""))
    with pytest.raises(Unavailable):
        await KubeClient(transport).list_with_version(CLAIMS)
