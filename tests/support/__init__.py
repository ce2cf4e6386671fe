"""Helpers shared by the unit, integration and end-to-end tests, among them the in-memory
apiserver (``fakekube``) and one operator pass on it (``operator_pass``)."""
