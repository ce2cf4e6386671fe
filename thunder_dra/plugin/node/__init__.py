"""The node itself: its start-up facts (zone, role, advertised IP, GPU driver), commands
in the host's namespaces, the node's Thunder enrollment, and keeping thunderd healthy."""
