"""Durable state on the node: the checkpoint of prepared claims (and the claim model,
:class:`~thunder_dra.plugin.state.checkpoint.PreparedClaim`), the mint journal, the locks
between daemon instances and claims, and the crash points tests stop the daemon at."""
