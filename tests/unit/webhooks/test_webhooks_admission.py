"""The webhook's review of ThunderCluster and Client writes, and its certificate."""

from __future__ import annotations

import ipaddress
from typing import Any

from cryptography import x509

from thunder_dra.webhooks.admission import review_client, review_thundercluster
from thunder_dra.webhooks.server import self_signed_certificate


def cluster(name: str = "main", **operator: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"operator": operator}}


async def test_a_second_thundercluster_is_refused() -> None:
    async def existing() -> list[str]:
        return ["main"]

    async def published() -> bool:
        return False

    message = await review_thundercluster(cluster("other"), None, existing, published)
    assert message is not None
    assert 'only one ThunderCluster may exist per cluster, and "main" already does' in message


async def test_an_update_that_keeps_the_spec_is_always_allowed() -> None:
    async def existing() -> list[str]:
        raise AssertionError("no lookups for a metadata-only update")

    async def published() -> bool:
        raise AssertionError("no lookups for a metadata-only update")

    bad = cluster(reconcileInterval="1s")
    with_finalizer = {**bad, "metadata": {"name": "main", "finalizers": ["x"]}}
    assert await review_thundercluster(with_finalizer, bad, existing, published) is None


async def test_every_problem_is_reported_with_its_path() -> None:
    async def existing() -> list[str]:
        return []

    async def published() -> bool:
        return True

    old = cluster(deviceClassPrefix="thunder-gpu-")
    new = cluster(deviceClassPrefix="gpu-", reconcileInterval="1s")
    message = await review_thundercluster(new, old, existing, published)
    assert message is not None
    assert 'spec.operator.reconcileInterval: must be between 5s and 24h, got "1s"' in message


def test_client_reviews() -> None:
    spec = {
        "claim": {"namespace": "ns", "name": "gpu", "uid": "u1"},
        "nodeName": "n1",
        "zone": {"name": "z", "id": "zone-1"},
        "gpuType": "A6000",
        "gpuCount": 1,
    }
    assert review_client({"spec": spec}, None) is None
    grown = {"spec": {**spec, "gpuCount": 2}}
    assert review_client(grown, {"spec": spec}) == "spec.gpuCount: is immutable, was 1"
    assert review_client({"spec": spec, "metadata": {"finalizers": []}}, {"spec": spec}) is None


def test_the_self_signed_certificate_names_the_host() -> None:
    cert_pem, key_pem = self_signed_certificate(["webhook.example", "127.0.0.1"])
    certificate = x509.load_pem_x509_certificate(cert_pem)
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["webhook.example"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert b"PRIVATE KEY" in key_pem
