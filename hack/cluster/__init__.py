"""The local Kubernetes control plane: build, start, stop, and simulated nodes.

Run it by hand with ``python -m hack.cluster up|down|env|status``.
"""

from hack.cluster.launcher import (
    BINARY_VERSION,
    EMULATED_VERSIONS,
    Cluster,
    ClusterConfig,
    ClusterError,
    binaries,
    free_port,
)

__all__ = [
    "BINARY_VERSION",
    "EMULATED_VERSIONS",
    "Cluster",
    "ClusterConfig",
    "ClusterError",
    "binaries",
    "free_port",
]
