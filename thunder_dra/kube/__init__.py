"""Shared Kubernetes building blocks of the operator and the daemon.

``client`` (the one async client), ``errors`` (its error classes), ``transport`` (the
aiohttp transport and configuration loading), ``resources`` (API paths), ``testing``
and ``objectops`` (an in-memory apiserver for unit tests), ``quantity``, ``naming``
(names, labels and annotations the driver writes), ``provenance`` and
``admissionpolicy``.
"""

from thunder_dra.kube import naming

__all__ = ["naming"]
