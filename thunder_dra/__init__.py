"""Thunder Compute DRA driver: an operator and a kubelet plugin for network-attached GPUs."""

from thunder_dra.version import __version__

__all__ = ["__version__"]
