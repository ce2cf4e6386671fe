"""Provenance of Client records: proof that this driver's daemon wrote a Client.

The reaper revokes the Thunder enrollment a Client names once its ResourceClaim is gone.
Anyone allowed to create a Client could otherwise name an enrollment token ID of
another tenant and have the operator revoke it. So the daemon signs what it records,
and the reaper revokes only what carries a valid signature.

The signature is an HMAC-SHA256 over the Client's namespace, name, claim UID,
enrollment token ID and Thunder client ID, stored in the annotation
``thundercompute.com/provenance`` as ``v1:<hex>``. Its key is derived from the Thunder
API token, which the operator and every daemon already hold and nobody else needs; the
key itself is never written anywhere. Binding the namespace, name and claim UID means a
signature copied from one Client onto another does not verify.

Rotating the API token changes the key: Clients signed with the old token no longer
verify, and the reaper then removes their records without revoking (see
docs/operator.md). Unprepare on the node is unaffected: it works from the daemon's own
checkpoint, not from the Client.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Final

from thunder_dra.api.constants import DOMAIN
from thunder_dra.thunder import Secret

ANNOTATION: Final = f"{DOMAIN}/provenance"
SCHEME: Final = "v1"
_KEY_LABEL: Final = b"thundercompute.com/client-provenance/v1"


class ProvenanceKey:
    """Signs and verifies Client records; derived from the Thunder API token."""

    __slots__ = ("_key",)

    def __init__(self, api_token: Secret) -> None:
        token = api_token.reveal().encode("utf-8")
        if not token:
            raise ValueError("a provenance key needs a non-empty API token")
        # A key of its own, so the HMAC never uses the API token directly.
        self._key = hmac.new(token, _KEY_LABEL, hashlib.sha256).digest()

    def __repr__(self) -> str:
        return "ProvenanceKey(<derived from the API token>)"

    def sign(
        self,
        *,
        namespace: str,
        name: str,
        claim_uid: str,
        enrollment_token_id: str,
        client_id: str | None,
    ) -> str:
        """The annotation value for a Client with these fields."""
        message = json.dumps(
            [SCHEME, namespace, name, claim_uid, enrollment_token_id, client_id or ""],
            separators=(",", ":"),
            ensure_ascii=True,
        ).encode("ascii")
        return f"{SCHEME}:{hmac.new(self._key, message, hashlib.sha256).hexdigest()}"

    def verify(
        self,
        signature: str | None,
        *,
        namespace: str,
        name: str,
        claim_uid: str,
        enrollment_token_id: str,
        client_id: str | None,
    ) -> bool:
        """Whether `signature` is this driver's for a Client with these fields."""
        if not signature:
            return False
        expected = self.sign(
            namespace=namespace,
            name=name,
            claim_uid=claim_uid,
            enrollment_token_id=enrollment_token_id,
            client_id=client_id,
        )
        return hmac.compare_digest(expected.encode("ascii"), signature.encode("utf-8", "replace"))
