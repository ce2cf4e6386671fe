"""The test platform: local control plane, real node, fake Thunder service, fake host tools."""
