"""Client provenance: only the holder of the API token can sign a Client record."""

from __future__ import annotations

from typing import Any

import pytest

from thunder_dra.kube.provenance import ANNOTATION, ProvenanceKey
from thunder_dra.thunder import Secret

TOKEN = "thunder-api-token-under-test"
FIELDS: dict[str, Any] = {
    "namespace": "team-a",
    "name": "claim-1234",
    "claim_uid": "1234",
    "enrollment_token_id": "et-1",
    "client_id": "client-1",
}


def test_a_signature_verifies_for_the_same_fields_and_token() -> None:
    key = ProvenanceKey(Secret(TOKEN))
    signature = key.sign(**FIELDS)
    assert signature.startswith("v1:")
    assert ProvenanceKey(Secret(TOKEN)).verify(signature, **FIELDS)


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_a_signature_does_not_carry_over_to_any_other_field_value(field: str) -> None:
    key = ProvenanceKey(Secret(TOKEN))
    signature = key.sign(**FIELDS)
    assert not key.verify(signature, **{**FIELDS, field: "other"})


def test_field_boundaries_are_unambiguous() -> None:
    key = ProvenanceKey(Secret(TOKEN))
    one = key.sign(**{**FIELDS, "namespace": "a", "name": "bc"})
    assert not key.verify(one, **{**FIELDS, "namespace": "ab", "name": "c"})


def test_another_token_or_no_signature_does_not_verify() -> None:
    signature = ProvenanceKey(Secret(TOKEN)).sign(**FIELDS)
    assert not ProvenanceKey(Secret("another-token")).verify(signature, **FIELDS)
    key = ProvenanceKey(Secret(TOKEN))
    assert not key.verify(None, **FIELDS)
    assert not key.verify("", **FIELDS)
    assert not key.verify("v1:" + "0" * 64, **FIELDS)
    assert not key.verify("\udcff not ascii", **FIELDS)


def test_neither_the_token_nor_the_key_shows() -> None:
    key = ProvenanceKey(Secret(TOKEN))
    assert TOKEN not in repr(key)
    assert TOKEN not in key.sign(**FIELDS)
    assert ANNOTATION == "thundercompute.com/provenance"


def test_an_empty_token_is_refused() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        ProvenanceKey(Secret(""))
