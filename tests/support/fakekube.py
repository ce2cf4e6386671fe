"""An in-memory apiserver behind the client's transport seam, for unit tests.

``KubeClient(FakeKube())`` behaves like a client of a real apiserver for the calls the
driver makes: objects are stored by path with uid, resourceVersion and
creationTimestamp; create answers 409 AlreadyExists, replace and patch check a given
resourceVersion, delete honours uid/resourceVersion preconditions and finalizers (the
object stays, with deletionTimestamp, until the last finalizer is removed), a write naming
another uid is refused (422, the uid is immutable); merge-patch (RFC 7386), JSON patch
(RFC 6902) and apply are applied (an apply creates a missing object, but not through a
subresource); lists filter by namespace, label
selector (``k=v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``) and equality field selectors,
and page with ``limit``/``continue``. Kinds with a status subresource keep status and
spec apart as the apiserver does.

Faults are scripted with :meth:`FakeKube.fail` (an HTTP status, an exception such as
``ConnectionResetError``, or a request that never answers), and every request is kept in
:attr:`FakeKube.requests`.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import yaml

from tests.support.objectops import (
    Refused,
    field_matches,
    json_patch,
    label_matches,
    merge_patch,
)
from thunder_dra.kube.client import (
    APPLY_PATCH,
    JSON,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    Request,
    Response,
)

STATUS_SUBRESOURCE: Final = frozenset(
    {"clients", "thunderclusters", "resourceclaims", "pods", "nodes", "daemonsets"}
)
"""Plurals whose status is written only through /status (and spec never through it)."""

_CLUSTER_SCOPED: Final = frozenset(
    {
        "nodes",
        "namespaces",
        "resourceslices",
        "deviceclasses",
        "thunderclusters",
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
    }
)


@dataclass(frozen=True, slots=True)
class Address:
    """A request path taken apart."""

    api: str
    plural: str
    namespace: str | None
    name: str | None
    subresource: str | None

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.api, self.plural, self.namespace or "", self.name or "")


def parse_path(path: str) -> Address:
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        api, rest = f"/api/{parts[1]}", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        api, rest = f"/apis/{parts[1]}/{parts[2]}", parts[3:]
    else:
        raise ValueError(f"not an API path: {path!r}")
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest:
        raise ValueError(f"no resource in {path!r}")
    plural, name, sub = rest[0], None, None
    if len(rest) >= 2:
        name = rest[1]
    if len(rest) >= 3:
        sub = "/".join(rest[2:])
    return Address(api, plural, namespace, name, sub)


@dataclass(slots=True)
class Fault:
    method: str
    path: re.Pattern[str]
    status: int | None
    error: BaseException | None
    hang: bool
    body: JSON | None
    times: int | None

    def matches(self, request: Request) -> bool:
        return (self.method in ("*", request.method)) and bool(self.path.search(request.path))


def status_body(status: int, reason: str, message: str, **details: Any) -> JSON:
    """An apiserver Status object."""
    body: JSON = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if status < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": status,
    }
    if details:
        body["details"] = details
    return body


@dataclass
class FakeKube:
    """An in-memory apiserver; pass it to ``KubeClient`` as the transport."""

    objects: dict[tuple[str, str, str, str], JSON] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    expire_continue_tokens: bool = False
    """When true, every list continue token is answered 410 Gone (an expired token)."""
    hung: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a request is held by a ``hang`` fault."""
    closed: bool = False
    opened: int = 0
    _versions: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    # -- seeding and inspection --------------------------------------------------------

    def put(self, collection: str, obj: Mapping[str, Any]) -> JSON:
        """Store ``obj`` in ``collection`` as if created (no faults, not logged)."""
        return self._create(parse_path(collection), dict(obj), dry_run=False)

    def get(self, path: str) -> JSON | None:
        """The stored object at an item path (a copy), or None."""
        found = self.objects.get(parse_path(path).key)
        return copy.deepcopy(found) if found is not None else None

    def calls(self, method: str | None = None, path: str | None = None) -> list[Request]:
        """The requests made, optionally only those with this method and path prefix."""
        return [
            r
            for r in self.requests
            if (method is None or r.method == method) and (path is None or r.path.startswith(path))
        ]

    def fail(
        self,
        method: str,
        path: str,
        *,
        status: int | None = None,
        error: BaseException | None = None,
        hang: bool = False,
        body: JSON | None = None,
        times: int | None = 1,
    ) -> None:
        """Answer the next ``times`` (None: every) requests whose method is ``method`` ("*"
        for any) and whose path matches the regular expression ``path``: with ``status``
        (and ``body``, else a Status), by raising ``error``, or never (``hang``)."""
        if [status is not None, error is not None, hang].count(True) != 1:
            raise ValueError("give exactly one of status, error or hang")
        self.faults.append(Fault(method, re.compile(path), status, error, hang, body, times))

    # -- the transport -----------------------------------------------------------------

    async def open(self) -> None:
        self.opened += 1

    async def close(self) -> None:
        self.closed = True

    async def send(self, request: Request) -> Response:
        if self.closed:
            raise ConnectionError("the transport is closed")
        self.requests.append(request)
        await asyncio.sleep(0)
        for fault in self.faults:
            if not fault.matches(request):
                continue
            if fault.times is not None:
                fault.times -= 1
                if fault.times <= 0:
                    self.faults.remove(fault)
            if fault.hang:
                self.hung.set()
                await asyncio.Event().wait()
            if fault.error is not None:
                raise fault.error
            assert fault.status is not None
            body = fault.body or status_body(fault.status, "Injected", "injected fault")
            return Response(fault.status, "Injected", json.dumps(body).encode())
        try:
            answer = self._handle(request)
        except Refused as exc:
            body = status_body(exc.status, exc.reason, exc.message)
            return Response(exc.status, exc.reason, json.dumps(body).encode())
        return Response(200 if request.method != "POST" else 201, "OK", json.dumps(answer).encode())

    # -- the apiserver -----------------------------------------------------------------

    def _handle(self, request: Request) -> Any:
        try:
            address = parse_path(request.path)
        except ValueError as exc:
            raise Refused(404, "NotFound", str(exc)) from None
        query = dict(request.query)
        body = self._decode(request)
        dry_run = "dryRun" in query
        handlers: dict[tuple[str, bool], Callable[[], Any]] = {
            ("GET", False): lambda: self._list(address, query),
            ("GET", True): lambda: copy.deepcopy(self._stored(address)),
            ("POST", False): lambda: self._create(address, body, dry_run=dry_run),
            ("PUT", True): lambda: self._replace(address, body),
            ("PATCH", True): lambda: self._patch(address, body, request.content_type, query),
            ("DELETE", True): lambda: self._delete(address, body),
        }
        handler = handlers.get((request.method, address.name is not None))
        if handler is None:
            raise Refused(405, "MethodNotAllowed", f"{request.method} {request.path}")
        return handler()

    def _decode(self, request: Request) -> Any:
        if request.body is None:
            return None
        try:
            if request.content_type == APPLY_PATCH:
                return yaml.safe_load(request.body)
            return json.loads(request.body)
        except (ValueError, yaml.YAMLError) as exc:
            raise Refused(400, "BadRequest", f"the body is not valid: {exc}") from None

    def _stored(self, address: Address) -> JSON:
        found = self.objects.get(address.key)
        if found is None:
            what = f"{address.plural} {address.name!r}"
            raise Refused(404, "NotFound", f"{what} not found")
        return found

    def _version(self) -> str:
        return str(next(self._versions))

    def _list(self, address: Address, query: Mapping[str, str]) -> JSON:
        items = [
            obj
            for (api, plural, namespace, _), obj in sorted(self.objects.items())
            if api == address.api
            and plural == address.plural
            and (address.namespace is None or namespace == address.namespace)
        ]
        labels = query.get("labelSelector")
        if labels:
            items = [o for o in items if label_matches(o["metadata"].get("labels") or {}, labels)]
        fields = query.get("fieldSelector")
        if fields:
            items = [o for o in items if field_matches(o, fields)]
        start = 0
        if query.get("continue"):
            if self.expire_continue_tokens:
                raise Refused(410, "Expired", "the provided continue parameter is too old")
            start = int(query["continue"])
        metadata: JSON = {"resourceVersion": self._version()}
        limit = int(query.get("limit") or 0)
        if limit and start + limit < len(items):
            metadata["continue"] = str(start + limit)
            items = items[start : start + limit]
        else:
            items = items[start:]
        return {
            "kind": "List",
            "apiVersion": "v1",
            "metadata": metadata,
            "items": copy.deepcopy(items),
        }

    def _create(self, address: Address, body: Any, *, dry_run: bool) -> JSON:
        if not isinstance(body, dict):
            raise Refused(400, "BadRequest", "the body must be an object")
        obj = copy.deepcopy(body)
        metadata = obj.setdefault("metadata", {})
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:5]
        name = metadata.get("name")
        if not name:
            raise Refused(422, "Invalid", "metadata.name: Required value")
        if address.plural not in _CLUSTER_SCOPED:
            if address.namespace is None:
                raise Refused(404, "NotFound", f"{address.plural} are namespaced")
            if metadata.get("namespace", address.namespace) != address.namespace:
                raise Refused(400, "BadRequest", "the namespace of the object does not match")
            metadata["namespace"] = address.namespace
        item = Address(address.api, address.plural, address.namespace, name, None)
        if item.key in self.objects:
            raise Refused(409, "AlreadyExists", f'{address.plural} "{name}" already exists')
        metadata["uid"] = str(uuid.uuid4())
        metadata["resourceVersion"] = self._version()
        metadata["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        metadata["generation"] = 1
        if not dry_run:
            self.objects[item.key] = obj
        return copy.deepcopy(obj)

    def _check_version(self, stored: JSON, body: Any) -> None:
        wanted = ((body or {}).get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != stored["metadata"]["resourceVersion"]:
            raise Refused(
                409,
                "Conflict",
                "the object has been modified; please apply your changes to the latest "
                "version and try again",
            )

    def _store(self, address: Address, stored: JSON, new: JSON) -> JSON:
        if address.plural in STATUS_SUBRESOURCE:
            if address.subresource == "status":
                new = {**stored, "status": new.get("status")}
            else:
                new = {**new, "status": stored.get("status")}
            if new.get("status") is None:
                new.pop("status")
        metadata = dict(new.get("metadata") or {})
        uid = metadata.get("uid")
        if uid and uid != stored["metadata"]["uid"]:
            raise Refused(
                422,
                "Invalid",
                f'{address.name!r} is invalid: metadata.uid: Invalid value: "{uid}": '
                "field is immutable",
            )
        for key in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp"):
            if key in stored["metadata"]:
                metadata[key] = stored["metadata"][key]
        if new.get("spec") != stored.get("spec"):
            metadata["generation"] = int(stored["metadata"].get("generation", 1)) + 1
        if {**new, "metadata": metadata} == stored:
            return copy.deepcopy(stored)
        metadata["resourceVersion"] = self._version()
        new = {**new, "metadata": metadata}
        if metadata.get("deletionTimestamp") and not metadata.get("finalizers"):
            del self.objects[address.key]
        else:
            self.objects[address.key] = new
        return copy.deepcopy(new)

    def _replace(self, address: Address, body: Any) -> JSON:
        stored = self._stored(address)
        if not isinstance(body, dict):
            raise Refused(400, "BadRequest", "the body must be an object")
        self._check_version(stored, body)
        return self._store(address, stored, copy.deepcopy(body))

    def _patch(
        self, address: Address, body: Any, content_type: str | None, query: Mapping[str, str]
    ) -> JSON:
        if (
            content_type == APPLY_PATCH
            and address.key not in self.objects
            and not address.subresource
        ):
            if not query.get("fieldManager"):
                raise Refused(422, "Invalid", "fieldManager is required for apply")
            collection = Address(address.api, address.plural, address.namespace, None, None)
            return self._create(collection, body, dry_run="dryRun" in query)
        stored = self._stored(address)
        if content_type == JSON_PATCH:
            if not isinstance(body, list):
                raise Refused(400, "BadRequest", "a JSON patch is a list of operations")
            new = json_patch(stored, body)
        elif content_type in (MERGE_PATCH, STRATEGIC_MERGE_PATCH, APPLY_PATCH):
            if not isinstance(body, dict):
                raise Refused(400, "BadRequest", "a merge patch is an object")
            if content_type == APPLY_PATCH and not query.get("fieldManager"):
                raise Refused(422, "Invalid", "fieldManager is required for apply")
            self._check_version(stored, body)
            new = merge_patch(stored, body)
        else:
            raise Refused(415, "UnsupportedMediaType", f"patch type {content_type!r}")
        return self._store(address, stored, new)

    def _delete(self, address: Address, body: Any) -> JSON:
        stored = self._stored(address)
        preconditions = (body or {}).get("preconditions") or {}
        for key in ("uid", "resourceVersion"):
            wanted = preconditions.get(key)
            if wanted and wanted != stored["metadata"].get(key):
                raise Refused(
                    409, "Conflict", f"Precondition failed: {key} in precondition: {wanted}"
                )
        if stored["metadata"].get("finalizers"):
            if not stored["metadata"].get("deletionTimestamp"):
                stored["metadata"]["deletionTimestamp"] = datetime.now(UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                )
                stored["metadata"]["resourceVersion"] = self._version()
            return copy.deepcopy(stored)
        del self.objects[address.key]
        return status_body(
            200, "", "", name=address.name, kind=address.plural, uid=stored["metadata"]["uid"]
        )
