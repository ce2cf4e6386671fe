"""The claim lifecycle: a claim's allocation, prepare, repair, unprepare and rollback, the
start-up recovery and rebuild of lost checkpoint entries, the claim's records in the API,
and :mod:`.lifecycle`, which wires them together for one daemon instance."""
