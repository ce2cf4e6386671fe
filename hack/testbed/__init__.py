"""Simulated nodes and operator set-ups on the local control plane, shared by `make demo`,
the benchmarks and the tests: Kubernetes helpers (`kube`), the kubelet stand-in
(`kubelet`), daemons on simulated nodes (`daemon`) and the operator under test (`operator`).

Use them from Python: `from hack.testbed.daemon import NodeHarness`.
"""
