"""Shared Kubernetes helpers: names, labels and annotations the driver writes."""

from thunder_dra.kube import naming

__all__ = ["naming"]
