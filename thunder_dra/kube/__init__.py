"""Shared Kubernetes building blocks of the operator and the daemon.

``client`` (the one async client), ``errors`` (its error classes), ``transport`` (the
aiohttp transport and configuration loading), ``resources`` (API paths), ``quantity``,
``naming`` (names, labels and annotations the driver writes), ``provenance`` and
``admissionpolicy``. The in-memory apiserver of the unit tests is in ``tests/support/``.
"""

from thunder_dra.kube import naming

__all__ = ["naming"]
