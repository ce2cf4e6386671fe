"""The node daemon: the DRA kubelet plugin that prepares Thunder GPU claims on its node.

Run it with ``python -m thunder_dra.plugin`` (see ``docs/daemon.md``). One module per
responsibility:

- start-up and wiring: ``config`` (flags), ``daemon`` (the process), ``node`` (zone,
  serving mode, advertised IP, the nvidia-smi check), ``recovery`` (journal rollback
  and repair at start), ``health``, ``metrics``, ``tracing``, ``logs``;
- the kubelet surface: ``service`` (registration, DRA v1/v1beta1 and gRPC health on
  unix sockets) and ``handler`` (per-claim locks, the cross-instance file lock);
- claims: ``allocation`` (a claim's allocation to zone, model and count),
  ``prepare``, ``unprepare``, ``repair``, ``rollback``, ``records`` (Client resources
  and VM Secrets; Kubernetes calls go through ``thunder_dra.kube.client``);
- node enrollment: ``enrollment`` and ``thunderd`` (keeping it healthy);
- files: ``cdi`` (CDI specs), ``checkpoint`` (prepared claims), ``journal`` (the mint
  journal), ``libcache`` and ``library`` (the libthunder cache), ``clientconfig`` (a
  claim's ``config.json``), ``guest`` (install commands and the KubeVirt guest script),
  ``hostrunner`` (commands in the host's namespaces), ``locks``, ``crashpoints`` (a
  test hook, armed only by the test-only entry point ``hack.daemon_under_test``).
"""
