"""The node daemon: the DRA kubelet plugin that prepares Thunder GPU claims on its node.

One module per responsibility: ``service`` (the kubelet-facing gRPC servers), ``cdi``
(CDI specs), ``checkpoint`` (prepared claims), ``journal`` (the mint journal),
``libcache`` (the libthunder cache), ``clientconfig`` (a claim's ``config.json``),
``guest`` (install commands and the KubeVirt guest script) and ``hostrunner`` (commands
in the host's namespaces).
"""
