"""A small test-side view of a Kubernetes API: dynamic objects as dicts, and waiting.

Tests talk to the local control plane through the official client's dynamic
API so every resource, including ``resource.k8s.io/v1`` and the project's own
CRDs, is handled the same way.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config, dynamic
from kubernetes.dynamic.exceptions import NotFoundError

from hack.cluster.nodes import create_node, delete_node

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """What a test waited for did not happen; the message says what and what was seen last."""


def wait_for(
    probe: Callable[[], T | None],
    what: str,
    timeout: float = 60.0,
    interval: float = 0.2,
) -> T:
    """Call ``probe`` until it returns something truthy; fail naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = probe()
        except NotFoundError as err:
            value, last = None, err
        if value:
            return value
        if value is not None:
            last = value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
        time.sleep(interval)


class Kube:
    """Dynamic access to one cluster for tests."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.api_client = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        self.core = client.CoreV1Api(self.api_client)
        self.dyn = dynamic.DynamicClient(self.api_client)  # type: ignore[no-untyped-call]

    def resource(self, api_version: str, kind: str) -> Any:
        return self.dyn.resources.get(api_version=api_version, kind=kind)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        res = self.resource(obj["apiVersion"], obj["kind"])
        ns = obj.get("metadata", {}).get("namespace")
        created: dict[str, Any] = res.create(body=obj, namespace=ns).to_dict()
        return created

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = (
                self.resource(api_version, kind).get(name=name, namespace=namespace).to_dict()
            )
        except NotFoundError:
            return None
        return found

    def list_objects(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        label_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        res = self.resource(api_version, kind)
        items = res.get(namespace=namespace, label_selector=label_selector).to_dict()["items"]
        return list(items)

    def create_pod(self, namespace: str, pod: dict[str, Any]) -> None:
        body: Any = pod
        self.core.create_namespaced_pod(namespace, body)

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> None:
        with suppress(NotFoundError):
            self.resource(api_version, kind).delete(name=name, namespace=namespace)

    @contextmanager
    def namespace(self, prefix: str = "t") -> Iterator[str]:
        """A fresh namespace whose default ServiceAccount exists, deleted afterwards."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        body: Any = {"metadata": {"name": name}}
        self.core.create_namespace(body)
        wait_for(
            lambda: self._has_default_sa(name),
            f"the default ServiceAccount of namespace {name}",
        )
        try:
            yield name
        finally:
            self.core.delete_namespace(name)

    def _has_default_sa(self, namespace: str) -> bool:
        try:
            self.core.read_namespaced_service_account("default", namespace)
        except client.ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    @contextmanager
    def nodes(self, specs: dict[str, dict[str, Any]]) -> Iterator[list[str]]:
        """Simulated nodes by name, each with keyword arguments of ``create_node``."""
        made: list[str] = []
        try:
            for name, kwargs in specs.items():
                create_node(self.core, name, **kwargs)
                made.append(name)
            yield made
        finally:
            for name in made:
                delete_node(self.core, name)
