"""Development and test tooling: local control plane, fake Thunder service, fake host tools."""
