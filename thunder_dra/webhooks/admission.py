"""The validating admission webhook, served by the operator through kopf.

Two handlers, at the paths the chart's ValidatingWebhookConfiguration names (kopf
serves a handler at `/<handler id>`):

- `/validate-thundercluster`: ThunderCluster CREATE and UPDATE, checked by
  `validate_thundercluster` with the context it needs: the names of the ThunderClusters
  already stored, and whether any ResourceSlice or DeviceClass of the driver exists.
- `/validate-client`: Client CREATE and UPDATE, checked by `validate_client`.

An UPDATE that leaves the spec as it was (metadata or finalizers only, as kopf and the
daemon make) is allowed without checks: refusing it could never fix the spec and would
only block a finalizer from being removed, and with it the object's deletion.

A rejection answers 422 with every problem found, each with its field path.
The operator does not create or patch the ValidatingWebhookConfiguration itself (that
would need cluster-wide write rights on admission configuration): the Helm chart, the
kustomize manifests and the OLM bundle own it.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Final

import kopf

from thunder_dra.api.constants import CLIENT_PLURAL, GROUP, THUNDER_CLUSTER_PLURAL, VERSION
from thunder_dra.webhooks.validation import format_errors, validate_client, validate_thundercluster

THUNDER_CLUSTER_WEBHOOK: Final = "validate-thundercluster"
CLIENT_WEBHOOK: Final = "validate-client"
REJECTED: Final = 422

NamesLookup = Callable[[], Awaitable[Collection[str]]]
PublishedLookup = Callable[[], Awaitable[bool]]


def _plain(body: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if body is None else copy.deepcopy(dict(body))


def _spec_unchanged(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    return old is not None and new.get("spec") == old.get("spec")


async def review_thundercluster(
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    existing_names: NamesLookup,
    objects_published: PublishedLookup,
) -> str | None:
    """The rejection message for a ThunderCluster write, or None to allow it."""
    if _spec_unchanged(new, old):
        return None
    names = await existing_names() if old is None else ()
    published = await objects_published() if old is not None else False
    errors = validate_thundercluster(
        new, old=old, existing_names=names, objects_published=published
    )
    return format_errors(errors) if errors else None


def review_client(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> str | None:
    """The rejection message for a Client write, or None to allow it."""
    if _spec_unchanged(new, old):
        return None
    errors = validate_client(new, old=old)
    return format_errors(errors) if errors else None


def register_webhooks(
    registry: kopf.OperatorRegistry,
    *,
    existing_names: NamesLookup,
    objects_published: PublishedLookup,
) -> None:
    """Add both validating handlers to `registry`."""

    @kopf.on.validate(
        GROUP,
        VERSION,
        THUNDER_CLUSTER_PLURAL,
        id=THUNDER_CLUSTER_WEBHOOK,
        operations=["CREATE", "UPDATE"],
        registry=registry,
    )
    async def validate_thundercluster_webhook(
        *, body: kopf.Body, old: kopf.Body | None = None, **_: Any
    ) -> None:
        new = _plain(body) or {}
        message = await review_thundercluster(new, _plain(old), existing_names, objects_published)
        if message is not None:
            raise kopf.AdmissionError(message, code=REJECTED)

    @kopf.on.validate(
        GROUP,
        VERSION,
        CLIENT_PLURAL,
        id=CLIENT_WEBHOOK,
        operations=["CREATE", "UPDATE"],
        registry=registry,
    )
    async def validate_client_webhook(
        *, body: kopf.Body, old: kopf.Body | None = None, **_: Any
    ) -> None:
        message = review_client(_plain(body) or {}, _plain(old))
        if message is not None:
            raise kopf.AdmissionError(message, code=REJECTED)
