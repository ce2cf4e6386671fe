"""What a prepared claim leaves in the API: its ``Client`` record, a VM's setup Secret, events.

The ``Client`` (``clients.thundercompute.com``) is named ``claim-<claim uid>`` in the
claim's namespace: always a valid name whatever the claim is called, and distinct for a
claim deleted and re-created under the same name (the old record can still be held by
its finalizer while the operator revokes it). It carries the finalizer
``thundercompute.com/client-cleanup``, so it cannot disappear before its enrollment is
revoked, and no owner reference: when a claim vanishes without an unprepare, the
operator's reaper (not the garbage collector) revokes and removes it.

A KubeVirt VM's ``<claim>-thunder-setup`` Secret holds the enrollment token and the guest
install script; it is owned by the ResourceClaim (not as controller, without blocking
deletion), so it goes away with the claim at the latest. It is labelled with the claim
UID and annotated with the token ID and the node, so the daemon only ever replaces or
deletes a Secret its node made for that claim.

The daemon cannot read Secrets (RBAC grants it create, update and delete only) and the
driver's admission policies (:mod:`thunder_dra.kube.admissionpolicy`) let it write only
setup Secrets and Clients of its own node. So a Secret is written with create, then
replace (no read in between: the policy refuses the replace unless the existing Secret
is this node's, for this claim), and looked at only through a JSON patch of ``test``
operations: it changes nothing, fails unless the Secret is the claim's, and the same
policy refuses it for a Secret another node made.
"""

from __future__ import annotations

import base64
import logging
from typing import Any

from pydantic import ValidationError

from thunder_dra.api import (
    API_VERSION,
    CLIENT_FINALIZER,
    ClaimReference,
    Client,
    ClientPhase,
    ClientSpec,
    ConsumerKind,
    ZoneReference,
)
from thunder_dra.api.constants import CLIENT_KIND, DOMAIN
from thunder_dra.kube import bodies, naming, provenance
from thunder_dra.kube.admissionpolicy import ANNOTATION_NODE_NAME, LABEL_CLAIM_UID
from thunder_dra.kube.client import JSON, KubeClient
from thunder_dra.kube.errors import Conflict, Forbidden, Invalid, NotFound
from thunder_dra.kube.events import EventRecorder, ObjectRef
from thunder_dra.kube.resources import CLIENTS, SECRETS
from thunder_dra.plugin.files.guest import GUEST_SCRIPT_KEY, GUEST_TOKEN_KEY, guest_secret_name
from thunder_dra.plugin.state.checkpoint import ClaimState, Consumer, PreparedClaim, PreparedDevice
from thunder_dra.thunder import Secret

ANNOTATION_TOKEN_ID = f"{DOMAIN}/enrollment-token-id"
CLAIM_API_VERSION = "resource.k8s.io/v1"
_FINALIZER_RETRIES = 5

log = logging.getLogger(__name__)


def client_name(claim_uid: str) -> str:
    return f"claim-{claim_uid}"


def _labels(claim_uid: str) -> dict[str, str]:
    return {**naming.component_labels(naming.COMPONENT_DAEMON), LABEL_CLAIM_UID: claim_uid}


def client_spec(claim: PreparedClaim, node_name: str) -> ClientSpec:
    """The ``Client`` spec of a prepared claim (immutable once written)."""
    return ClientSpec(
        claim=ClaimReference(namespace=claim.namespace, name=claim.name, uid=claim.uid),
        node_name=node_name,
        zone=ZoneReference(name=claim.zone_name, id=claim.zone_id),
        gpu_type=claim.gpu_type,
        gpu_count=claim.gpu_count,
        enrollment_token_id=claim.enrollment_token_id or "",
        consumer_kind=ConsumerKind.VIRTUAL_MACHINE if claim.is_vm else ConsumerKind.POD,
        consumer_name=claim.consumer.name,
        client_id=claim.client_id or "",
    )


def client_status(claim: PreparedClaim) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": ClientPhase.ENROLLED.value}
    if claim.client_id:
        status["clientId"] = claim.client_id
    else:
        status["message"] = (
            f"enrollment token delivered in Secret {guest_secret_name(claim.name)}; "
            "the VM's guest enrolls itself"
        )
    return status


def parse_client(raw: JSON) -> Client | None:
    """A ``Client`` as read from the API server; None (logged) if it does not match the
    model, which the CRD's schema makes a record no daemon wrote."""
    try:
        return Client.model_validate(raw)
    except ValidationError as err:
        metadata = bodies.metadata(raw)
        log.warning(
            "a Client record does not match its schema; left alone",
            extra={
                "namespace": metadata.get("namespace"),
                "client": metadata.get("name"),
                "error": str(err),
            },
        )
        return None


def claim_from_client(
    client: Client, *, devices: tuple[PreparedDevice, ...], paths: tuple[str, ...]
) -> PreparedClaim:
    """The prepared claim a ``Client`` records (the reverse of :func:`client_spec`); the
    devices come from the claim's allocation and the paths from the node's file layout."""
    spec = client.spec
    vm = spec.consumer_kind is ConsumerKind.VIRTUAL_MACHINE
    return PreparedClaim(
        uid=spec.claim.uid,
        namespace=spec.claim.namespace,
        name=spec.claim.name,
        consumer=Consumer(kind="vm" if vm else "pod", name=spec.consumer_name),
        zone_name=spec.zone.name,
        zone_id=spec.zone.id,
        gpu_type=spec.gpu_type,
        gpu_count=spec.gpu_count,
        enrollment_token_id=spec.enrollment_token_id or None,
        client_id=client.client_id,
        secret_name=guest_secret_name(spec.claim.name) if vm else None,
        devices=devices,
        paths=paths,
        state=ClaimState.PREPARED,
    )


def _pointer(key: str) -> str:
    """``key`` as one JSON pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _token_id_of(client: JSON) -> str:
    return str(bodies.spec(client).get("enrollmentTokenId") or "")


class Records:
    def __init__(
        self,
        kube: KubeClient,
        node_name: str,
        provenance_key: provenance.ProvenanceKey,
        *,
        events: EventRecorder,
    ) -> None:
        self._kube = kube
        self._node = node_name
        self._provenance = provenance_key
        self._events = events

    # Clients

    async def record_client(self, claim: PreparedClaim) -> None:
        """Create (or bring up to date) the claim's Client, then set its status."""
        await self.write_client(claim)
        await self.mark_enrolled(claim)

    async def write_client(self, claim: PreparedClaim) -> None:
        """Create (or bring up to date) the claim's Client: finalizer, provenance and spec,
        the client ID included, which is all the operator's reaper and a checkpoint
        rebuild need. Its status stays ``Pending`` until :meth:`mark_enrolled`."""
        try:
            await self._kube.create_client(claim.namespace, self._client_body(claim))
        except Conflict:
            await self._adopt(claim)

    async def mark_enrolled(self, claim: PreparedClaim) -> None:
        """Set the claim's Client status to ``Enrolled`` (with the client ID, or a VM's
        note), on the record of this enrollment only: the patch tests the record's token
        ID, so it never lands on a later record of the claim. A record already gone, or
        replaced, is left as it is."""
        name = client_name(claim.uid)
        token_id = claim.enrollment_token_id or ""
        operations: list[dict[str, Any]] = [
            {"op": "test", "path": "/spec/enrollmentTokenId", "value": token_id},
            {"op": "add", "path": "/status", "value": client_status(claim)},
        ]
        try:
            await self._kube.json_patch_client_status(claim.namespace, name, operations)
        except NotFound:
            return
        except Invalid:
            # A failed test and an invalid status are both refused as Invalid: the record
            # tells them apart.
            current = await self._get_raw_client(claim.namespace, claim.uid)
            if current is not None and _token_id_of(current) == token_id:
                raise

    async def _adopt(self, claim: PreparedClaim) -> None:
        name = client_name(claim.uid)
        existing = await self._kube.get_client(claim.namespace, name)
        metadata = bodies.metadata(existing)
        if metadata.get("deletionTimestamp"):
            # A record on its way out (an earlier unprepare, or the reaper): let it go and
            # start a fresh one; its enrollment is revoked by whoever deleted it.
            await self._release_finalizer(claim.namespace, name)
            await self._kube.create_client(claim.namespace, self._client_body(claim))
            return
        recorded = _token_id_of(existing)
        if recorded and recorded != (claim.enrollment_token_id or ""):
            # The record of an earlier enrollment of this claim (a re-enrollment, or an
            # attempt the journal rolls back): its spec is immutable, so it is replaced.
            # Its enrollment is revoked by whoever ended it (the journal holds it).
            await self.delete_client(claim.namespace, claim.uid, only_token_id=recorded)
            await self._kube.create_client(claim.namespace, self._client_body(claim))
            return
        finalizers = list(metadata.get("finalizers") or [])
        if CLIENT_FINALIZER not in finalizers:
            finalizers.append(CLIENT_FINALIZER)
        patch = {
            "metadata": {"finalizers": finalizers, "annotations": self._provenance_of(claim)},
            "spec": client_spec(claim, self._node).to_json_dict(),
        }
        await self._kube.patch_client(claim.namespace, name, patch)

    def _provenance_of(self, claim: PreparedClaim) -> dict[str, str]:
        """The signature that lets the operator's reaper revoke this enrollment."""
        signature = self._provenance.sign(
            namespace=claim.namespace,
            name=client_name(claim.uid),
            claim_uid=claim.uid,
            enrollment_token_id=claim.enrollment_token_id or "",
            client_id=claim.client_id,
        )
        return {provenance.ANNOTATION: signature}

    def _client_body(self, claim: PreparedClaim) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": CLIENT_KIND,
            "metadata": {
                "name": client_name(claim.uid),
                "namespace": claim.namespace,
                "labels": _labels(claim.uid),
                "finalizers": [CLIENT_FINALIZER],
                "annotations": self._provenance_of(claim),
            },
            "spec": client_spec(claim, self._node).to_json_dict(),
        }

    async def get_client(self, namespace: str, claim_uid: str) -> Client | None:
        """The claim's ``Client``, or None if there is none (or none the model reads)."""
        raw = await self._get_raw_client(namespace, claim_uid)
        return parse_client(raw) if raw is not None else None

    async def _get_raw_client(self, namespace: str, claim_uid: str) -> JSON | None:
        try:
            return await self._kube.get_client(namespace, client_name(claim_uid))
        except NotFound:
            return None

    async def delete_client(
        self, namespace: str, claim_uid: str, *, only_token_id: str | None = None
    ) -> bool:
        """Delete the claim's Client: drop our finalizer, then delete the record; absent is
        done already.

        ``only_token_id``: delete only if the record is for that enrollment (a rollback must
        not remove the record of a later, successful attempt). True if it was removed.

        The finalizer goes first, by a JSON patch that tests it (and ``only_token_id``), so
        the delete removes the record at once, never Terminating: the API server and etcd
        spend about a tenth less than on a delete that marks it Terminating and a patch
        that ends it (docs/benchmarks.md, Kubernetes requests of a claim). Every caller
        has revoked the record's enrollment already or holds it in an open journal entry,
        so a crash between the two leaves a record without its finalizer whose enrollment
        is taken care of, and the next unprepare, rollback or sweep deletes it.
        """
        name = client_name(claim_uid)
        tests: list[dict[str, Any]] = []
        if only_token_id is not None:
            tests.append({"op": "test", "path": "/spec/enrollmentTokenId", "value": only_token_id})
        first = "/metadata/finalizers/0"
        try:
            patched = await self._kube.json_patch_client(
                namespace,
                name,
                [
                    *tests,
                    {"op": "test", "path": first, "value": CLIENT_FINALIZER},
                    {"op": "remove", "path": first},
                ],
            )
        except NotFound:
            return False
        except Invalid:
            # A test failed: another enrollment's record, or our finalizer is not the first
            # (someone else's comes before it) or gone (a crash between the two steps).
            existing = await self._get_raw_client(namespace, claim_uid)
            if existing is None or (
                only_token_id is not None and _token_id_of(existing) != only_token_id
            ):
                return False
            await self._release_finalizer(namespace, name)
            patched = existing
        try:
            # The uid precondition: never a record that replaced this one meanwhile.
            await self._kube.delete_client(namespace, name, uid=bodies.metadata(patched).get("uid"))
        except NotFound:
            return True  # the patch ended a record already Terminating
        except Conflict:
            return False
        return True

    async def _release_finalizer(self, namespace: str, name: str) -> None:
        for _ in range(_FINALIZER_RETRIES):
            try:
                current = await self._kube.get_client(namespace, name)
            except NotFound:
                return
            metadata = bodies.metadata(current)
            finalizers = list(metadata.get("finalizers") or [])
            if CLIENT_FINALIZER not in finalizers:
                return
            remaining = [f for f in finalizers if f != CLIENT_FINALIZER]
            patch = {
                "metadata": {
                    "finalizers": remaining or None,
                    "resourceVersion": metadata.get("resourceVersion"),
                }
            }
            try:
                await self._kube.patch_client(namespace, name, patch)
                return
            except NotFound:
                return
            except Conflict:
                continue
        raise Conflict(
            "PATCH",
            CLIENTS.item(name, namespace),
            409,
            "Conflict",
            f"the finalizers of Client {namespace}/{name} kept changing",
        )

    # KubeVirt guest Secrets

    async def write_guest_secret(
        self,
        *,
        namespace: str,
        claim_name: str,
        claim_uid: str,
        token: Secret,
        token_id: str,
        script: str,
    ) -> None:
        name = guest_secret_name(claim_name)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": _labels(claim_uid),
                "annotations": {ANNOTATION_TOKEN_ID: token_id, ANNOTATION_NODE_NAME: self._node},
                "ownerReferences": [
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceClaim",
                        "name": claim_name,
                        "uid": claim_uid,
                        "controller": False,
                        "blockOwnerDeletion": False,
                    }
                ],
            },
            "data": {
                GUEST_TOKEN_KEY: base64.b64encode(token.reveal().encode()).decode(),
                GUEST_SCRIPT_KEY: base64.b64encode(script.encode()).decode(),
            },
        }
        try:
            await self._kube.create_secret(namespace, body)
        except Conflict:
            # One left by an earlier attempt for this claim on this node: replaced as a
            # whole. Admission refuses the replace of any other Secret of that name.
            try:
                await self._kube.replace_secret(namespace, name, body)
            except Forbidden as err:
                raise Forbidden(
                    err.method,
                    err.path,
                    err.status,
                    err.reason,
                    f"a Secret of that name exists and was not made for claim {claim_uid} "
                    f"on node {self._node} ({err.message})",
                ) from None

    async def _probe_guest_secret(
        self, namespace: str, name: str, claim_uid: str, token_id: str | None = None
    ) -> JSON | None:
        """The Secret if it is this claim's (and that enrollment's), else None.

        A JSON patch of nothing but ``test`` operations: it changes nothing and answers
        with the object, or fails if a label or annotation differs. Admission checks it
        like any write, so a Secret its node did not make is refused, not shown."""
        tests: list[dict[str, Any]] = [
            {
                "op": "test",
                "path": f"/metadata/labels/{_pointer(LABEL_CLAIM_UID)}",
                "value": claim_uid,
            }
        ]
        if token_id is not None:
            tests.append(
                {
                    "op": "test",
                    "path": f"/metadata/annotations/{_pointer(ANNOTATION_TOKEN_ID)}",
                    "value": token_id,
                }
            )
        try:
            return await self._kube.json_patch(SECRETS.item(name, namespace), tests)
        except NotFound:
            return None
        except Forbidden as err:
            log.warning(
                "a setup Secret of that name exists but was not made on this node",
                extra={"namespace": namespace, "secret": name, "error": err.message},
            )
            return None
        except Invalid as err:
            if err.status == 422:
                return None  # a test failed: there, but for another claim or enrollment
            raise

    async def guest_secret_exists(self, namespace: str, claim_name: str, claim_uid: str) -> bool:
        name = guest_secret_name(claim_name)
        return await self._probe_guest_secret(namespace, name, claim_uid) is not None

    async def delete_guest_secret(
        self, namespace: str, claim_name: str, claim_uid: str, *, only_token_id: str | None = None
    ) -> bool:
        name = guest_secret_name(claim_name)
        existing = await self._probe_guest_secret(namespace, name, claim_uid, only_token_id)
        if existing is None:
            return False
        metadata = bodies.metadata(existing)
        # Exactly the version just checked: a later attempt's replacement is kept.
        try:
            await self._kube.delete(
                SECRETS.item(name, namespace),
                uid=metadata.get("uid"),
                resource_version=metadata.get("resourceVersion"),
            )
        except (NotFound, Conflict):
            return False
        return True

    # Events

    async def claim_event(
        self, namespace: str, claim_name: str, claim_uid: str, reason: str, message: str
    ) -> None:
        """A Warning event on the ResourceClaim, through the recorder both processes share
        (repeats counted, secrets masked); best effort: a failure is only logged."""
        claim = ObjectRef(CLAIM_API_VERSION, "ResourceClaim", claim_name, claim_uid, namespace)
        await self._events.post(claim, "Warning", reason, message)
