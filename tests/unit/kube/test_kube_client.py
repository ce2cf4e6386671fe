"""The Kubernetes client over the in-memory apiserver: errors, paging, timeouts,
cancellation and the content type of each kind of write."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.fakekube import FakeKube
from thunder_dra.kube.client import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    KubeClient,
    Request,
    Response,
)
from thunder_dra.kube.errors import (
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    KubeError,
    NotFound,
    Timeout,
    Unavailable,
    from_answer,
)
from thunder_dra.kube.resources import (
    CLIENTS,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    SECRETS,
    path_template,
    resource_of,
)


def _client(fake: FakeKube, **kwargs: object) -> KubeClient:
    return KubeClient(fake, **kwargs)  # type: ignore[arg-type]


def _slice(name: str, **labels: str) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": labels}, "spec": {"driver": "d"}}


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, Invalid),
        (401, Forbidden),
        (403, Forbidden),
        (404, NotFound),
        (405, KubeError),
        (409, Conflict),
        (410, Gone),
        (422, Invalid),
        (429, Unavailable),
        (500, Unavailable),
        (503, Unavailable),
        (504, Timeout),
    ],
)
async def test_each_status_raises_its_error_class_with_the_apiservers_words(
    status: int, error: type[KubeError]
) -> None:
    fake = FakeKube()
    kube = _client(fake)
    body = {"kind": "Status", "reason": "SomeReason", "message": "the apiserver says no"}
    fake.fail("GET", "/pods/p1$", status=status, body=body)
    path = "/api/v1/namespaces/ns/pods/p1"
    with pytest.raises(error) as caught:
        await kube.get(path)
    assert type(caught.value) is error
    assert (caught.value.method, caught.value.path, caught.value.status) == ("GET", path, status)
    assert caught.value.reason == "SomeReason"
    assert caught.value.message == "the apiserver says no"
    assert str(caught.value) == f"GET {path}: {status} SomeReason: the apiserver says no"
    assert caught.value.retryable is (status in (429, 500, 503, 504))


async def test_not_found_and_already_exists_from_the_store() -> None:
    kube = _client(FakeKube())
    path = CLIENTS.item("c1", "ns")
    with pytest.raises(NotFound, match="clients 'c1' not found"):
        await kube.get(path)
    assert await kube.get_optional(path) is None
    await kube.create(CLIENTS.collection("ns"), {"metadata": {"name": "c1"}})
    with pytest.raises(Conflict) as caught:
        await kube.create(CLIENTS.collection("ns"), {"metadata": {"name": "c1"}})
    assert caught.value.already_exists
    assert (await kube.get(path))["metadata"]["namespace"] == "ns"


async def test_a_stale_resource_version_is_a_conflict_not_already_exists() -> None:
    kube = _client(FakeKube())
    created = await kube.create(SECRETS.collection("ns"), {"metadata": {"name": "s"}})
    fresh = {**created, "data": {"k": "dg=="}}
    await kube.replace(SECRETS.item("s", "ns"), fresh)
    with pytest.raises(Conflict) as caught:
        await kube.replace(SECRETS.item("s", "ns"), {**created, "data": {"k": "eA=="}})
    assert not caught.value.already_exists


def test_a_secrets_invalid_values_never_reach_the_error() -> None:
    body = json.dumps(
        {
            "reason": "Invalid",
            "message": 'Secret "s" is invalid: data[k]: Invalid value: "s3cr3t-value": bad',
        }
    ).encode()
    error = from_answer("POST", SECRETS.collection("ns"), 422, "Unprocessable", body)
    assert isinstance(error, Invalid)
    assert "s3cr3t-value" not in str(error)
    assert "data[k]: Invalid value: (withheld)" in error.message
    other = from_answer("POST", CLIENTS.collection("ns"), 422, "Unprocessable", body)
    assert "s3cr3t-value" in other.message


def test_a_non_json_or_huge_error_answer_is_kept_short_and_readable() -> None:
    error = from_answer("GET", "/api/v1/nodes/n", 502, "Bad Gateway", b"<html>" + b"x" * 5000)
    assert isinstance(error, Unavailable)
    assert error.reason == "Bad Gateway"
    assert error.message.startswith("<html>")
    assert len(error.message) <= 500


async def test_paging_follows_continue_tokens_with_the_selectors_on_every_page() -> None:
    fake = FakeKube()
    kube = _client(fake)
    for i in range(7):
        fake.put(RESOURCE_SLICES.collection(), _slice(f"s{i}", app="mine" if i % 2 else "other"))
    fake.put(RESOURCE_SLICES.collection(), _slice("zz", app="mine"))
    pages = [
        [item["metadata"]["name"] for item in page]
        async for page in kube.list_pages(
            RESOURCE_SLICES.collection(), label_selector="app=mine", limit=2
        )
    ]
    assert pages == [["s1", "s3"], ["s5", "zz"]]
    lists = fake.calls("GET", RESOURCE_SLICES.collection())
    assert [dict(r.query).get("continue") for r in lists] == [None, "2"]
    assert all(dict(r.query)["labelSelector"] == "app=mine" for r in lists)
    assert all(dict(r.query)["limit"] == "2" for r in lists)
    everything = await kube.list_all(RESOURCE_SLICES.collection(), field_selector="spec.driver=d")
    assert len(everything) == 8


async def test_an_expired_continue_token_is_gone_and_list_all_lists_again_once() -> None:
    fake = FakeKube()
    kube = _client(fake)
    for i in range(250):
        fake.put(RESOURCE_SLICES.collection(), _slice(f"s{i:03}"))
    fake.fail("GET", "/resourceslices$", status=410, times=1)
    fake.requests.clear()
    # The first page answers 410 once (as if a watch cache had moved on): relisted.
    assert len(await kube.list_all(RESOURCE_SLICES.collection())) == 250
    fake.expire_continue_tokens = True
    with pytest.raises(Gone):
        async for _page in kube.list_pages(RESOURCE_SLICES.collection()):
            pass
    with pytest.raises(Gone):
        await kube.list_all(RESOURCE_SLICES.collection())


async def test_a_call_that_gets_no_answer_times_out_per_call_and_per_client() -> None:
    fake = FakeKube()
    fake.fail("GET", "/nodes/", hang=True, times=None)
    kube = _client(fake, timeout=0.05)
    with pytest.raises(Timeout) as caught:
        await kube.get("/api/v1/nodes/n1")
    assert caught.value.status is None
    assert caught.value.retryable
    assert "0.05s" in str(caught.value)
    slow = _client(fake, timeout=3600)
    with pytest.raises(Timeout, match=r"0\.02s"):
        await slow.request("GET", "/api/v1/nodes/n1", request_timeout=0.02)


async def test_a_refused_or_reset_connection_is_unavailable() -> None:
    fake = FakeKube()
    kube = _client(fake)
    fake.fail("*", "", error=ConnectionResetError(104, "Connection reset by peer"))
    with pytest.raises(Unavailable) as caught:
        await kube.get("/api/v1/nodes/n1")
    assert type(caught.value) is Unavailable
    assert caught.value.reason == "ConnectionResetError"
    assert caught.value.status is None
    assert "Connection reset by peer" in caught.value.message


async def test_cancelling_the_caller_cancels_the_request() -> None:
    fake = FakeKube()
    fake.fail("GET", "", hang=True)
    kube = _client(fake, timeout=3600)
    task = asyncio.create_task(kube.get("/api/v1/nodes/n1"))
    await fake.hung.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await kube.get_optional("/api/v1/nodes/n1")) is None


async def test_each_write_sends_its_content_type_and_body() -> None:
    fake = FakeKube()
    kube = _client(fake)
    path = CLIENTS.item("c1", "ns")
    await kube.create(CLIENTS.collection("ns"), {"metadata": {"name": "c1"}, "spec": {"a": 1}})
    merged = await kube.merge_patch(path, {"spec": {"a": None, "b": 2}})
    assert merged["spec"] == {"b": 2}
    patched = await kube.json_patch(
        path,
        [
            {"op": "test", "path": "/spec/b", "value": 2},
            {"op": "add", "path": "/spec/c", "value": 3},
        ],
    )
    assert patched["spec"] == {"b": 2, "c": 3}
    with pytest.raises(Invalid):
        await kube.json_patch(path, [{"op": "test", "path": "/spec/b", "value": 99}])
    applied = await kube.apply(path, {"spec": {"d": 4}}, field_manager="thunder", force=True)
    assert applied["spec"]["d"] == 4
    writes = [(r.method, r.content_type) for r in fake.requests if r.method != "GET"]
    assert writes == [
        ("POST", "application/json"),
        ("PATCH", MERGE_PATCH),
        ("PATCH", JSON_PATCH),
        ("PATCH", JSON_PATCH),
        ("PATCH", APPLY_PATCH),
    ]
    assert json.loads(fake.requests[2].body or b"") == [
        {"op": "test", "path": "/spec/b", "value": 2},
        {"op": "add", "path": "/spec/c", "value": 3},
    ]
    assert dict(fake.requests[-1].query) == {"fieldManager": "thunder", "force": "true"}
    assert [r.content_type for r in fake.requests if r.method == "GET"] == []


async def test_status_is_written_only_through_the_status_subresource() -> None:
    fake = FakeKube()
    kube = _client(fake)
    path = CLIENTS.item("c1", "ns")
    await kube.create(CLIENTS.collection("ns"), {"metadata": {"name": "c1"}, "spec": {"a": 1}})
    await kube.merge_patch(path, {"status": {"phase": "Ignored"}})
    assert "status" not in await kube.get(path)
    await kube.merge_patch(path + "/status", {"status": {"phase": "Ready"}, "spec": {"a": 9}})
    stored = await kube.get(path)
    assert stored["status"] == {"phase": "Ready"}
    assert stored["spec"] == {"a": 1}


async def test_delete_keeps_an_object_with_finalizers_and_checks_preconditions() -> None:
    fake = FakeKube()
    kube = _client(fake)
    path = CLIENTS.item("c1", "ns")
    created = await kube.create(
        CLIENTS.collection("ns"), {"metadata": {"name": "c1", "finalizers": ["x/y"]}}
    )
    with pytest.raises(Conflict, match="Precondition failed"):
        await kube.delete(path, uid="another-uid")
    answer = await kube.delete(path, uid=created["metadata"]["uid"])
    assert answer is not None
    assert answer["metadata"]["deletionTimestamp"]
    await kube.json_patch(path, [{"op": "remove", "path": "/metadata/finalizers"}])
    assert fake.get(path) is None
    with pytest.raises(NotFound):
        await kube.delete(path)
    delete = fake.calls("DELETE")[0]
    assert json.loads(delete.body or b"")["preconditions"] == {"uid": "another-uid"}


async def test_writes_are_reported_by_resource_and_verb_but_reads_and_dry_runs_are_not() -> None:
    seen: list[tuple[str, str]] = []
    kube = _client(FakeKube(), on_write=lambda resource, verb: seen.append((resource, verb)))
    await kube.create(CLIENTS.collection("ns"), {"metadata": {"name": "c1"}})
    await kube.create(CLIENTS.collection("ns"), {"metadata": {"name": "c2"}}, dry_run=True)
    await kube.get(CLIENTS.item("c1", "ns"))
    await kube.merge_patch(CLIENTS.item("c1", "ns", "status"), {"status": {}})
    await kube.replace(CLIENTS.item("c1", "ns"), {"metadata": {"name": "c1"}})
    await kube.delete(CLIENTS.item("c1", "ns"))
    with pytest.raises(NotFound):
        await kube.delete(CLIENTS.item("c1", "ns"))
    assert seen == [
        ("clients", "create"),
        ("clients/status", "patch"),
        ("clients", "update"),
        ("clients", "delete"),
        ("clients", "delete"),
    ]


def test_resource_of_names_the_resource_as_rbac_does() -> None:
    assert resource_of("/apis/thundercompute.com/v1alpha1/namespaces/n/clients") == "clients"
    assert resource_of(CLIENTS.item("c", "n", "status")) == "clients/status"
    assert resource_of("/api/v1/namespaces/n") == "namespaces"
    assert resource_of("/api/v1/namespaces/n/events/e") == "events"
    assert resource_of(RESOURCE_SLICES.item("s")) == "resourceslices"


def test_a_path_template_names_what_was_addressed_but_not_which_object() -> None:
    assert (
        path_template(CLIENTS.item("c", "n", "status"))
        == "/apis/thundercompute.com/v1alpha1/namespaces/{namespace}/clients/{name}/status"
    )
    assert path_template(CLIENTS.collection("n")) == (
        "/apis/thundercompute.com/v1alpha1/namespaces/{namespace}/clients"
    )
    assert path_template("/api/v1/namespaces/n") == "/api/v1/namespaces/{name}"
    assert path_template("/api/v1/nodes/n1?watch=1") == "/api/v1/nodes/{name}"
    assert path_template(RESOURCE_SLICES.collection()) == "/apis/resource.k8s.io/v1/resourceslices"
    assert path_template("/version") == "/version"


_NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1, max_size=40).filter(
    lambda n: n not in (".", "..")
)


@given(name=_NAMES, namespace=_NAMES)
def test_a_path_template_is_the_same_whatever_the_object_and_namespace(
    name: str, namespace: str
) -> None:
    paths: tuple[Callable[[str, str], str], ...] = (
        lambda n, ns: PODS.item(n, ns),
        lambda n, ns: RESOURCE_CLAIMS.item(n, ns, "status"),
        lambda n, ns: CLIENTS.collection(ns),
        lambda n, ns: RESOURCE_SLICES.item(n),
    )
    for path_of in paths:
        assert path_template(path_of(name, namespace)) == path_template(path_of("a", "b"))


def _spans(**kwargs: object) -> tuple[KubeClient, FakeKube, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    fake = FakeKube()
    return _client(fake, tracer=provider.get_tracer("test"), **kwargs), fake, exporter


def _only(exporter: InMemorySpanExporter) -> ReadableSpan:
    [span] = exporter.get_finished_spans()
    return span


async def test_each_request_is_a_client_span_named_by_its_method_and_template() -> None:
    kube, _, exporter = _spans()
    await kube.create(CLIENTS.collection("team-a"), {"metadata": {"name": "claim-1"}})
    span = _only(exporter)
    template = "/apis/thundercompute.com/v1alpha1/namespaces/{namespace}/clients"
    assert span.name == f"POST kube:{template}"
    assert span.kind.name == "CLIENT"
    assert dict(span.attributes or {}) == {
        "http.request.method": "POST",
        "url.template": template,
        "k8s.resource": "clients",
        "http.response.status_code": 201,
    }
    assert span.status.status_code.name == "UNSET"
    # Which object, and what was sent, stay out of the span.
    for text in (span.name, *map(str, (span.attributes or {}).values())):
        assert "team-a" not in text
        assert "claim-1" not in text


async def test_a_refused_request_or_one_without_an_answer_is_an_error_span() -> None:
    kube, fake, exporter = _spans()
    with pytest.raises(NotFound):
        await kube.get(CLIENTS.item("gone", "team-a"))
    span = _only(exporter)
    assert span.attributes is not None
    assert span.attributes["http.response.status_code"] == 404
    assert span.status.status_code.name == "ERROR"
    assert span.status.description == "NotFound"  # the Status reason, as the error has it

    exporter.clear()
    refusal = {"kind": "Status", "status": "Failure", "reason": "Invalid" + "x" * 500}
    fake.fail("GET", "/api/v1/nodes/n0", status=422, body=refusal)
    with pytest.raises(Invalid):
        await kube.get("/api/v1/nodes/n0")
    assert _only(exporter).status.description == "Invalid" + "x" * 57  # 64 characters

    exporter.clear()
    fake.fail("*", "", error=ConnectionResetError(104, "Connection reset by peer"))
    with pytest.raises(Unavailable):
        await kube.get("/api/v1/nodes/n1")
    span = _only(exporter)
    assert span.attributes is not None
    assert "http.response.status_code" not in span.attributes
    assert span.status.status_code.name == "ERROR"
    assert span.status.description == "ConnectionResetError"


def test_paths_quote_names_and_refuse_empty_ones() -> None:
    assert (
        CLIENTS.item("a b", "ns") == "/apis/thundercompute.com/v1alpha1/namespaces/ns/clients/a%20b"
    )
    with pytest.raises(ValueError, match="needs a namespace"):
        CLIENTS.item("c")
    with pytest.raises(ValueError, match="not a valid object name"):
        RESOURCE_SLICES.item("")


async def test_an_answer_that_is_not_json_is_a_kube_error() -> None:
    class Garbled:
        async def open(self) -> None:
            pass

        async def send(self, request: Request) -> Response:
            return Response(200, "OK", b"<html>")

        async def close(self) -> None:
            pass

    with pytest.raises(KubeError, match="not JSON") as caught:
        await KubeClient(Garbled()).get("/api/v1/nodes/n")
    assert caught.value.reason == "InvalidAnswer"


async def test_closing_closes_the_transport() -> None:
    fake = FakeKube()
    async with _client(fake) as kube:
        await kube.open()
    assert fake.opened == 1
    assert fake.closed
    with pytest.raises(Unavailable):
        await kube.get("/api/v1/nodes/n")


async def test_the_daemons_typed_calls_address_their_objects() -> None:
    fake = FakeKube()
    kube = _client(fake)
    fake.put("/api/v1/nodes", {"metadata": {"name": "n1"}})
    fake.put("/api/v1/namespaces/ns/pods", {"metadata": {"name": "p1"}})
    fake.put("/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims", {"metadata": {"name": "rc"}})
    fake.put(RESOURCE_SLICES.collection(), {**_slice("mine", app="x"), "spec": {"driver": "d"}})
    fake.put(RESOURCE_SLICES.collection(), {**_slice("other", app="x"), "spec": {"driver": "e"}})
    assert (await kube.get_node("n1"))["metadata"]["name"] == "n1"
    assert (await kube.get_pod("ns", "p1"))["metadata"]["name"] == "p1"
    assert (await kube.get_claim("ns", "rc"))["metadata"]["name"] == "rc"
    found = await kube.list_slices(driver="d", label_selector="app=x")
    assert [s["metadata"]["name"] for s in found] == ["mine"]
    secret = {"metadata": {"name": "s"}, "data": {"k": "dg=="}}
    created = await kube.create_secret("ns", secret)
    await kube.replace_secret("ns", "s", {**created, "data": {"k": "dw=="}})
    assert (await kube.get_secret("ns", "s"))["data"] == {"k": "dw=="}
    with pytest.raises(Conflict):
        await kube.delete_secret("ns", "s", uid="not-its-uid")
    await kube.delete_secret("ns", "s", uid=created["metadata"]["uid"])
    await kube.create_event("ns", {"metadata": {"generateName": "rc."}, "reason": "R"})
    assert len(fake.calls("POST", "/api/v1/namespaces/ns/events")) == 1
    client = {"metadata": {"name": "c1", "labels": {"l": "v"}, "finalizers": ["f"]}}
    await kube.create_client("ns", client)
    await kube.patch_client("ns", "c1", {"spec": {"a": 1}})
    status = [{"op": "add", "path": "/status", "value": {"phase": "Ready"}}]
    await kube.json_patch_client_status("ns", "c1", status)
    await kube.json_patch_client("ns", "c1", [{"op": "add", "path": "/spec/b", "value": 2}])
    stored = await kube.get_client("ns", "c1")
    assert (stored["spec"], stored["status"]) == ({"a": 1, "b": 2}, {"phase": "Ready"})
    assert [c["metadata"]["name"] for c in await kube.list_clients(label_selector="l=v")] == ["c1"]
    terminating = await kube.delete_client("ns", "c1")
    assert terminating["metadata"]["deletionTimestamp"]
    status_write = fake.calls("PATCH", CLIENTS.item("c1", "ns", "status"))
    assert json.loads(status_write[0].body or b"") == status
