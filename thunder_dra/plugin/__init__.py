"""The node daemon: the DRA kubelet plugin that prepares Thunder GPU claims on its node.

Run it with ``python -m thunder_dra.plugin`` (see ``docs/daemon.md``). The process
(``__main__``, ``daemon``, ``config``, ``metrics``, ``errors``) sits here; each concern
has its subpackage, each importing only those below it (``state``, then ``files``,
``node``, ``claims``, ``kubelet``; ``python -m hack.layers`` checks it):

- ``kubelet``: plugin registration, the DRA v1/v1beta1 gRPC service, and the handler of
  NodePrepare/NodeUnprepareResources (per-claim locks, bounded work, errors per claim);
- ``claims``: the claim lifecycle (allocation, prepare, repair, unprepare, rollback,
  start-up recovery and rebuild, the ``Client`` records and VM Secrets), wired in
  ``claims.lifecycle`` (the kubelet handler is built over it in ``kubelet.handler``);
- ``state``: durable state (the checkpoint and its claim model ``PreparedClaim``, the
  mint journal, locks, and the crash points armed only by ``hack.daemon_under_test``);
- ``node``: the node's facts and GPU driver check, host commands, node enrollment and
  thunderd;
- ``files``: what a workload gets (CDI specs, ``config.json``, the verified installer and
  library cache, the host and guest install commands).
"""
