"""Process plumbing shared by the operator and the node daemon.

- `logs`: one JSON log schema (or text on a terminal) and the secret scrubber;
- `metrics`: the metric naming scheme and the registry both processes expose;
- `tracing`: the OpenTelemetry tracer provider, configured from the `OTEL_*` variables;
- `health`: the `/healthz`, `/readyz` and `/metrics` HTTP server.

Everything here knows nothing of claims, pools or kopf handlers; the operator
(`thunder_dra.controllers`) and the daemon (`thunder_dra.plugin`) build on it.
"""
