"""The real-node tests: one package, so their control plane and node end with them."""
