"""Development and test tooling: the local control plane, the fake Thunder service and fake host tools."""
