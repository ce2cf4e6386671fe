"""Kubernetes API calls for the operator, as plain camelCase dicts, off the event loop.

The official client's typed models are skipped on purpose: a pass over thousands of
ResourceSlices would build (and then serialise back) hundreds of thousands of model
objects. Requests go through the client's `ApiClient` (its configuration, TLS,
authentication and token refresh) with the response body decoded as JSON, which is
already the camelCase shape the planning code compares with.

Every blocking call runs in a bounded thread pool, never on the event loop; every write
is counted in `thunder_dra_operator_kubernetes_writes_total`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from thunder_dra.controllers.metrics import OperatorMetrics
from thunder_dra.kube.rest import send
from thunder_dra.version import user_agent

_T = TypeVar("_T")
_log = logging.getLogger(__name__)

LIST_PAGE_SIZE: Final = 100
"""Objects per list page: a page of ResourceSlices with 128 devices each stays a few MiB."""
REQUEST_TIMEOUT: Final = (10.0, 60.0)
"""Connect and read timeouts of one request, in seconds."""
_VERBS: Final = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"


class KubeError(Exception):
    """A Kubernetes API call failed; `status` is the HTTP status (None: no answer)."""

    def __init__(self, method: str, path: str, status: int | None, reason: str, message: str):
        self.method = method
        self.path = path
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{method} {path}: {status or 'no answer'} {reason}: {message}")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


@dataclass(frozen=True, slots=True)
class ResourcePath:
    """Where a kind of object lives in the API, e.g. resource.k8s.io/v1 resourceslices."""

    group: str
    version: str
    plural: str
    namespaced: bool = False

    def collection(self, namespace: str | None = None) -> str:
        base = f"/api/{self.version}" if self.group == "" else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace is not None:
            return f"{base}/namespaces/{namespace}/{self.plural}"
        return f"{base}/{self.plural}"

    def item(self, name: str, namespace: str | None = None, subresource: str = "") -> str:
        path = f"{self.collection(namespace)}/{name}"
        return f"{path}/{subresource}" if subresource else path


RESOURCE_SLICES: Final = ResourcePath("resource.k8s.io", "v1", "resourceslices")
DEVICE_CLASSES: Final = ResourcePath("resource.k8s.io", "v1", "deviceclasses")
RESOURCE_CLAIMS: Final = ResourcePath("resource.k8s.io", "v1", "resourceclaims", namespaced=True)
THUNDER_CLUSTERS: Final = ResourcePath("thundercompute.com", "v1alpha1", "thunderclusters")
CLIENTS: Final = ResourcePath("thundercompute.com", "v1alpha1", "clients", namespaced=True)
SECRETS: Final = ResourcePath("", "v1", "secrets", namespaced=True)
EVENTS: Final = ResourcePath("", "v1", "events", namespaced=True)
DAEMON_SETS: Final = ResourcePath("apps", "v1", "daemonsets", namespaced=True)
CLUSTER_PEERINGS: Final = ResourcePath("kopf.dev", "v1", "clusterkopfpeerings")


def load_configuration(kubeconfig: Path | None) -> k8s.Configuration:
    """The client configuration: the given kubeconfig, else in-cluster, else the default file."""
    configuration = k8s.Configuration()
    if kubeconfig is not None:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig), client_configuration=configuration
        )
        return configuration
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except k8s_config.ConfigException:
        k8s_config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return configuration


def _error_message(body: bytes | str | None) -> tuple[str, str]:
    if not body:
        return "", ""
    try:
        status = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        return "", text[:500]
    if not isinstance(status, dict):
        return "", str(status)[:500]
    return str(status.get("reason") or ""), str(status.get("message") or "")


class KubeApi:
    """Async access to the API server with dict bodies; one per process."""

    def __init__(
        self,
        configuration: k8s.Configuration,
        metrics: OperatorMetrics,
        *,
        workers: int = 12,
        request_timeout: tuple[float, float] = REQUEST_TIMEOUT,
    ) -> None:
        configuration.connection_pool_maxsize = max(workers, 4)
        self._timeout = request_timeout
        self.configuration = configuration
        self._api = k8s.ApiClient(configuration)
        self._api.user_agent = user_agent("operator")
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube")
        self._metrics = metrics

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._api.close()  # type: ignore[no-untyped-call]

    async def _in_thread(self, fn: Callable[[], _T]) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def _request_sync(
        self,
        method: str,
        path: str,
        query: Sequence[tuple[str, str]],
        body: Any,
        content_type: str | None,
    ) -> Any:
        try:
            response = send(
                self._api,
                method,
                path,
                query=query,
                body=body,
                content_type=content_type,
                timeout=self._timeout,
            )
        except ApiException as exc:
            reason, message = _error_message(exc.body)
            raise KubeError(method, path, exc.status, reason or str(exc.reason), message) from None
        except (OSError, Urllib3Error) as exc:
            # Timeouts, resets and refused connections (urllib3 wraps them after retries).
            raise KubeError(method, path, None, type(exc).__name__, str(exc)) from None
        if not 200 <= response.status <= 299:
            reason, message = _error_message(response.data)
            raise KubeError(method, path, response.status, reason or response.reason, message)
        data = response.data
        return json.loads(data) if data else None

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str | None = None,
        resource: str = "",
    ) -> Any:
        """One API call; writes are counted under `resource` (e.g. resourceslices)."""
        pairs = tuple((query or {}).items())
        dry_run = any(key == "dryRun" for key, _ in pairs)
        if method != "GET" and not dry_run:
            self._metrics.kubernetes_writes.labels(resource, _VERBS.get(method, method)).inc()
        return await self._in_thread(
            lambda: self._request_sync(method, path, pairs, body, content_type)
        )

    async def get(self, path: str) -> dict[str, Any] | None:
        """The object at `path`, or None if it does not exist."""
        try:
            found: dict[str, Any] = await self.request("GET", path)
        except KubeError as exc:
            if exc.not_found:
                return None
            raise
        return found

    async def list_pages(
        self,
        collection: str,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = LIST_PAGE_SIZE,
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """The items of a collection, a page at a time, so a caller can shrink them early."""
        token = ""
        while True:
            query = {"limit": str(limit)}
            if label_selector:
                query["labelSelector"] = label_selector
            if field_selector:
                query["fieldSelector"] = field_selector
            if token:
                query["continue"] = token
            page = await self.request("GET", collection, query=query)
            items: list[dict[str, Any]] = page.get("items") or []
            yield items
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return

    async def list_all(
        self, collection: str, *, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = []
        async for page in self.list_pages(collection, label_selector=label_selector):
            result.extend(page)
        return result

    async def create(
        self, collection: str, body: Mapping[str, Any], *, resource: str, dry_run: bool = False
    ) -> dict[str, Any]:
        query = {"dryRun": "All"} if dry_run else None
        created: dict[str, Any] = await self.request(
            "POST", collection, body=body, query=query, resource=resource
        )
        return created

    async def replace(self, path: str, body: Mapping[str, Any], *, resource: str) -> dict[str, Any]:
        replaced: dict[str, Any] = await self.request("PUT", path, body=body, resource=resource)
        return replaced

    async def merge_patch(
        self, path: str, patch: Mapping[str, Any], *, resource: str
    ) -> dict[str, Any]:
        patched: dict[str, Any] = await self.request(
            "PATCH", path, body=patch, content_type=MERGE_PATCH, resource=resource
        )
        return patched

    async def json_patch(
        self, path: str, operations: Sequence[Mapping[str, Any]], *, resource: str
    ) -> dict[str, Any]:
        patched: dict[str, Any] = await self.request(
            "PATCH", path, body=list(operations), content_type=JSON_PATCH, resource=resource
        )
        return patched

    async def delete(
        self,
        path: str,
        *,
        resource: str,
        resource_version: str | None = None,
        propagation: str | None = None,
    ) -> bool:
        """Delete; False if it was already gone. A changed resourceVersion raises a conflict."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if resource_version:
            body["preconditions"] = {"resourceVersion": resource_version}
        if propagation:
            body["propagationPolicy"] = propagation
        try:
            await self.request("DELETE", path, body=body, resource=resource)
        except KubeError as exc:
            if exc.not_found:
                return False
            raise
        return True
