"""The kubelet surface: plugin registration and the DRA gRPC service on unix sockets
(:mod:`.service`), and the NodePrepare/NodeUnprepareResources handler that locks, bounds,
traces and reports each claim (:mod:`.handler`)."""
