"""The daemon's Kubernetes calls, as plain JSON over the official client's REST layer.

Every call runs in a worker thread (the official client blocks) and returns decoded
JSON objects: the daemon reads a handful of fields from claims, pods, slices and nodes,
and skipping the client's model classes keeps a prepare's API round trips cheap.
Failures raise :class:`KubeError` (with ``status``); 404 is :class:`KubeNotFound` and
409 :class:`KubeConflict`, so callers can treat "already gone" and "already there" as
the idempotent outcomes they are. Every other failure, a timeout (``--kube-timeout`` per
request), a reset connection or a 5xx included, is a plain :class:`KubeError` with
``status`` None or the HTTP code: nothing else escapes a call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from thunder_dra.api.constants import CLIENT_PLURAL, GROUP, VERSION
from thunder_dra.kube.rest import send
from thunder_dra.version import user_agent

JSON = dict[str, Any]
RESOURCE_API = "/apis/resource.k8s.io/v1"
CLIENT_API = f"/apis/{GROUP}/{VERSION}"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
REQUEST_TIMEOUT = 20.0
_POOL_SIZE = 32
_MESSAGE_LIMIT = 300


class KubeError(Exception):
    """A Kubernetes API call failed; the message names the verb, the object and the reason."""

    def __init__(self, what: str, status: int | None, reason: str) -> None:
        super().__init__(f"Kubernetes {what}: {status or 'no answer'} {reason}".strip())
        self.status = status
        self.reason = reason


class KubeNotFound(KubeError):
    pass


class KubeConflict(KubeError):
    pass


def _reason(err: ApiException) -> str:
    try:
        body = json.loads(err.body or "")
        message = str(body.get("message") or err.reason or "")
    except (ValueError, AttributeError):
        message = str(err.reason or "")
    return message[:_MESSAGE_LIMIT]


def _q(value: str) -> str:
    return quote(value, safe="")


def load_api_client(kubeconfig: Path | None) -> client.ApiClient:
    """An API client from ``kubeconfig`` (if given) or the pod's service account."""
    configuration = client.Configuration()
    if kubeconfig is not None:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig), client_configuration=configuration
        )
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    # Enough connections for twenty claims in flight without queueing on the pool.
    configuration.connection_pool_maxsize = _POOL_SIZE
    api_client = client.ApiClient(configuration)
    api_client.user_agent = user_agent("daemon")
    return api_client


class KubeApi:
    def __init__(self, api_client: client.ApiClient, timeout: float = REQUEST_TIMEOUT) -> None:
        self._api = api_client
        self._timeout = timeout

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]

    def _request_sync(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = "application/json",
        what: str,
    ) -> JSON:
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
            data: bytes = response.data
        except ApiException as err:
            raise KubeError(what, err.status, _reason(err)) from None
        except Exception as err:  # urllib3 and socket errors: no HTTP answer at all
            raise KubeError(what, None, f"{type(err).__name__}: {err}") from None
        status = int(response.status)
        if 200 <= status < 300:
            try:
                decoded: JSON = json.loads(data) if data else {}
            except ValueError as err:
                raise KubeError(what, status, f"answer is not JSON: {err}") from None
            return decoded
        reason = _reason(ApiException(status=status, reason=response.reason, body=data.decode()))
        error = {404: KubeNotFound, 409: KubeConflict}.get(status, KubeError)
        raise error(what, status, reason)

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = "application/json",
        what: str,
    ) -> JSON:
        return await asyncio.to_thread(
            self._request_sync,
            method,
            path,
            query=query,
            body=body,
            content_type=content_type,
            what=what,
        )

    # Core objects.

    async def get_node(self, name: str) -> JSON:
        return await self.request("GET", f"/api/v1/nodes/{_q(name)}", what=f"get node {name}")

    async def get_pod(self, namespace: str, name: str) -> JSON:
        path = f"/api/v1/namespaces/{_q(namespace)}/pods/{_q(name)}"
        return await self.request("GET", path, what=f"get pod {namespace}/{name}")

    async def get_secret(self, namespace: str, name: str) -> JSON:
        path = f"/api/v1/namespaces/{_q(namespace)}/secrets/{_q(name)}"
        return await self.request("GET", path, what=f"get Secret {namespace}/{name}")

    async def create_secret(self, namespace: str, body: Mapping[str, Any]) -> JSON:
        path = f"/api/v1/namespaces/{_q(namespace)}/secrets"
        name = body["metadata"]["name"]
        return await self.request("POST", path, body=body, what=f"create Secret {namespace}/{name}")

    async def replace_secret(self, namespace: str, name: str, body: Mapping[str, Any]) -> JSON:
        path = f"/api/v1/namespaces/{_q(namespace)}/secrets/{_q(name)}"
        return await self.request("PUT", path, body=body, what=f"replace Secret {namespace}/{name}")

    async def delete_secret(self, namespace: str, name: str, uid: str | None = None) -> None:
        path = f"/api/v1/namespaces/{_q(namespace)}/secrets/{_q(name)}"
        body = {"preconditions": {"uid": uid}} if uid else None
        await self.request("DELETE", path, body=body, what=f"delete Secret {namespace}/{name}")

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        path = f"/api/v1/namespaces/{_q(namespace)}/events"
        await self.request("POST", path, body=body, what=f"create event in {namespace}")

    # resource.k8s.io/v1

    async def get_claim(self, namespace: str, name: str) -> JSON:
        path = f"{RESOURCE_API}/namespaces/{_q(namespace)}/resourceclaims/{_q(name)}"
        return await self.request("GET", path, what=f"get ResourceClaim {namespace}/{name}")

    async def list_slices(self, *, driver: str, label_selector: str) -> list[JSON]:
        query = [("fieldSelector", f"spec.driver={driver}"), ("labelSelector", label_selector)]
        found = await self.request(
            "GET", f"{RESOURCE_API}/resourceslices", query=query, what="list ResourceSlices"
        )
        return list(found.get("items") or [])

    # thundercompute.com Clients

    def _client_path(self, namespace: str, name: str = "") -> str:
        base = f"{CLIENT_API}/namespaces/{_q(namespace)}/{CLIENT_PLURAL}"
        return f"{base}/{_q(name)}" if name else base

    async def list_clients(self, *, label_selector: str) -> list[JSON]:
        """Clients in every namespace matching ``label_selector``."""
        found = await self.request(
            "GET",
            f"{CLIENT_API}/{CLIENT_PLURAL}",
            query=[("labelSelector", label_selector)],
            what="list Clients",
        )
        return list(found.get("items") or [])

    async def get_client(self, namespace: str, name: str) -> JSON:
        return await self.request(
            "GET", self._client_path(namespace, name), what=f"get Client {namespace}/{name}"
        )

    async def create_client(self, namespace: str, body: Mapping[str, Any]) -> JSON:
        name = body["metadata"]["name"]
        return await self.request(
            "POST",
            self._client_path(namespace),
            body=body,
            what=f"create Client {namespace}/{name}",
        )

    async def patch_client(self, namespace: str, name: str, patch: Mapping[str, Any]) -> JSON:
        return await self.request(
            "PATCH",
            self._client_path(namespace, name),
            body=patch,
            content_type=MERGE_PATCH,
            what=f"patch Client {namespace}/{name}",
        )

    async def patch_client_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> JSON:
        return await self.request(
            "PATCH",
            self._client_path(namespace, name) + "/status",
            body={"status": status},
            content_type=MERGE_PATCH,
            what=f"patch Client {namespace}/{name} status",
        )

    async def json_patch_client(
        self, namespace: str, name: str, operations: list[dict[str, Any]]
    ) -> JSON:
        return await self.request(
            "PATCH",
            self._client_path(namespace, name),
            body=operations,
            content_type=JSON_PATCH,
            what=f"patch Client {namespace}/{name}",
        )

    async def delete_client(self, namespace: str, name: str) -> JSON:
        """Delete; the answer is the object (still there, Terminating, if it has
        finalizers) or a Status (it is gone)."""
        return await self.request(
            "DELETE", self._client_path(namespace, name), what=f"delete Client {namespace}/{name}"
        )
