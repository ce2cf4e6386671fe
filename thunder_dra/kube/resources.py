"""Where each kind of object the driver reads or writes lives in the API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import quote

from thunder_dra.api.constants import CLIENT_PLURAL, GROUP, THUNDER_CLUSTER_PLURAL, VERSION


def _segment(value: str) -> str:
    if not value or value in (".", ".."):
        raise ValueError(f"not a valid object name or namespace for an API path: {value!r}")
    return quote(value, safe="")


@dataclass(frozen=True, slots=True)
class ResourcePath:
    """A kind's collection, e.g. resource.k8s.io/v1 resourceslices; names are path-quoted."""

    group: str
    version: str
    plural: str
    namespaced: bool = False

    @property
    def api(self) -> str:
        return f"/api/{self.version}" if self.group == "" else f"/apis/{self.group}/{self.version}"

    def collection(self, namespace: str | None = None) -> str:
        """The collection path; a namespaced kind without a namespace lists all namespaces."""
        if self.namespaced and namespace is not None:
            return f"{self.api}/namespaces/{_segment(namespace)}/{self.plural}"
        return f"{self.api}/{self.plural}"

    def item(self, name: str, namespace: str | None = None, subresource: str = "") -> str:
        if self.namespaced and namespace is None:
            raise ValueError(f"{self.plural} are namespaced: {name!r} needs a namespace")
        path = f"{self.collection(namespace)}/{_segment(name)}"
        return f"{path}/{subresource}" if subresource else path


NODES: Final = ResourcePath("", "v1", "nodes")
PODS: Final = ResourcePath("", "v1", "pods", namespaced=True)
SECRETS: Final = ResourcePath("", "v1", "secrets", namespaced=True)
EVENTS: Final = ResourcePath("", "v1", "events", namespaced=True)
DAEMON_SETS: Final = ResourcePath("apps", "v1", "daemonsets", namespaced=True)
LEASES: Final = ResourcePath("coordination.k8s.io", "v1", "leases", namespaced=True)
RESOURCE_SLICES: Final = ResourcePath("resource.k8s.io", "v1", "resourceslices")
DEVICE_CLASSES: Final = ResourcePath("resource.k8s.io", "v1", "deviceclasses")
RESOURCE_CLAIMS: Final = ResourcePath("resource.k8s.io", "v1", "resourceclaims", namespaced=True)
VALIDATING_ADMISSION_POLICIES: Final = ResourcePath(
    "admissionregistration.k8s.io", "v1", "validatingadmissionpolicies"
)
VALIDATING_ADMISSION_POLICY_BINDINGS: Final = ResourcePath(
    "admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings"
)
THUNDER_CLUSTERS: Final = ResourcePath(GROUP, VERSION, THUNDER_CLUSTER_PLURAL)
CLIENTS: Final = ResourcePath(GROUP, VERSION, CLIENT_PLURAL, namespaced=True)


def _segments(path: str) -> tuple[list[str], bool, list[str]]:
    """A request path taken apart, its query dropped: the API prefix (``api/<version>`` or
    ``apis/<group>/<version>``), whether ``namespaces/<namespace>`` follows it, and the
    segments from the resource on."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    size = 2 if parts[:1] == ["api"] else 3 if parts[:1] == ["apis"] else 0
    prefix, rest = parts[:size], parts[size:]
    namespaced = len(rest) >= 3 and rest[0] == "namespaces"
    return prefix, namespaced, rest[2:] if namespaced else rest


def path_template(path: str) -> str:
    """``path`` with its namespace and object name replaced by placeholders, as a request's
    span names it: what was addressed, never which object.

    ``/apis/g/v/namespaces/ns/clients/name/status`` ->
    ``/apis/g/v/namespaces/{namespace}/clients/{name}/status``;
    ``/api/v1/namespaces/ns`` -> ``/api/v1/namespaces/{name}``.
    """
    prefix, namespaced, rest = _segments(path)
    if len(rest) >= 2:
        rest = [rest[0], "{name}", *rest[2:]]
    scope = ["namespaces", "{namespace}"] if namespaced else []
    return "/" + "/".join([*prefix, *scope, *rest])


def resource_of(path: str) -> str:
    """The resource a path addresses, as RBAC names it: ``clients`` or ``clients/status``.

    ``/apis/g/v/namespaces/ns/clients/name/status`` -> ``clients/status``;
    ``/api/v1/namespaces/ns`` -> ``namespaces``.
    """
    _, _, rest = _segments(path)
    if not rest:
        return ""
    if len(rest) >= 3:
        return f"{rest[0]}/{rest[2]}"
    return rest[0]
