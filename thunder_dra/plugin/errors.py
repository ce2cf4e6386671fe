"""The error a claim's own failure raises, wherever in the daemon it is found.

:class:`ClaimError` sits below the daemon's subpackages: the claim lifecycle raises it
(an allocation it cannot serve, a refused library), the files it writes raise it too
(:mod:`thunder_dra.plugin.files.library`), and the kubelet handler turns it into a
per-claim error with its ``reason`` as the metric label.
"""

from __future__ import annotations

from thunder_dra.plugin.metrics import ErrorReason


class ClaimError(Exception):
    """A claim cannot be prepared as it stands; ``reason`` is the metric label."""

    def __init__(self, message: str, reason: ErrorReason = ErrorReason.CLAIM) -> None:
        super().__init__(message)
        self.reason = reason
