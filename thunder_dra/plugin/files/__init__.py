"""What a workload gets: CDI specs, a claim's ``config.json``, where a claim's files lie on
the node (:mod:`.layout`), the verified installer and the node's ``libthunder.so`` cache,
and the Thunder install commands (host and KubeVirt guest)."""
