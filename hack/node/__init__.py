"""A real local node: containerd, runc, CNI and a kubelet against the local control plane.

See ``hack.node.launcher``; ``python -m hack.node`` runs one by hand.
"""

from hack.node.launcher import (
    Node,
    NodeConfig,
    NodeError,
    NodeTools,
    cleanup_leftovers,
    node_tools,
    node_unavailable,
)

__all__ = [
    "Node",
    "NodeConfig",
    "NodeError",
    "NodeTools",
    "cleanup_leftovers",
    "node_tools",
    "node_unavailable",
]
