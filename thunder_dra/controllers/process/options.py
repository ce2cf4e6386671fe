"""The operator's command line: flags, their environment variables and defaults.

Every flag has an environment variable so a Deployment can configure the process
without a command line; a flag given on the command line wins. The Helm chart sets
the `THUNDER_*` variables named below, so both spellings of the namespace variable
are read (`THUNDER_DRA_NAMESPACE` first, then `THUNDER_NAMESPACE`).

No flag or variable is for tests: the tests' short reaper grace period
(`orphan_grace_period_override`) is set only by the test-only entry point
`hack.operator_under_test`, which the images do not ship.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Final

from thunder_dra.api import syntax
from thunder_dra.controllers.workload.tracing import (
    DEFAULT_HEADERS_KEY,
    NO_TRACING,
    DaemonTracing,
    SecretKey,
)
from thunder_dra.process.flags import duration

DEFAULT_NAMESPACE: Final = "thunder-system"
# The names kustomize (config/) and the OLM bundle give these objects, so an operator run
# without the chart finds what those installs made (docs/install-names.md).
DEFAULT_LEASE_NAME: Final = "thunder-device-plugin"
DEFAULT_DAEMON_SERVICE_ACCOUNT: Final = "thunder-daemon"
DEFAULT_OPERATOR_SERVICE_ACCOUNT: Final = "thunder-operator"
DEFAULT_HEALTH_PORT: Final = 8081
DEFAULT_METRICS_PORT: Final = 8080
CERT_FILE_IN_DIR: Final = "tls.crt"
KEY_FILE_IN_DIR: Final = "tls.key"
CA_FILE_IN_DIR: Final = "ca.crt"


@dataclass(frozen=True, slots=True)
class ElectionTimings:
    """How long the leader's Lease lasts, how long it keeps trying to renew, how often.

    The defaults are client-go's (15 s, 10 s, 2 s). A leader gives up after
    `renew_deadline` without a renewal, before any standby may take over at
    `lease_duration`; so `retry_period < renew_deadline < lease_duration`.
    """

    lease_duration: float = 15.0
    """Seconds a standby waits, after it last saw the Lease change, before taking it."""
    renew_deadline: float = 10.0
    """Seconds the leader keeps trying to renew before it stops reconciling."""
    retry_period: float = 2.0
    """Seconds between attempts, to acquire as a standby and to renew as the leader."""

    def __post_init__(self) -> None:
        for name, flag in _TIMING_FLAGS.items():
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{flag} must be a positive duration, got {value:g}s")
        if self.lease_duration != int(self.lease_duration):
            raise ValueError(
                "--leader-election-lease-duration must be whole seconds (it is the Lease's "
                f"leaseDurationSeconds), got {self.lease_duration:g}s"
            )
        if not self.renew_deadline < self.lease_duration:
            raise ValueError(
                f"--leader-election-renew-deadline ({self.renew_deadline:g}s) must be shorter "
                f"than --leader-election-lease-duration ({self.lease_duration:g}s)"
            )
        if not self.retry_period < self.renew_deadline:
            raise ValueError(
                f"--leader-election-retry-period ({self.retry_period:g}s) must be shorter "
                f"than --leader-election-renew-deadline ({self.renew_deadline:g}s)"
            )


_TIMING_FLAGS: Final = {
    "lease_duration": "--leader-election-lease-duration",
    "renew_deadline": "--leader-election-renew-deadline",
    "retry_period": "--leader-election-retry-period",
}


@dataclass(frozen=True, slots=True)
class OperatorOptions:
    """Everything the operator process is told at start-up."""

    namespace: str = DEFAULT_NAMESPACE
    """Where the daemon DaemonSet and the operator's events live."""
    kubeconfig: Path | None = None
    """A kubeconfig file; None means in-cluster, else $KUBECONFIG / ~/.kube/config."""
    cluster_name: str = ""
    """Reconcile only the ThunderCluster of this name ("" = the oldest one)."""
    standalone: bool = False
    """Reconcile at once, without leader election (one replica only)."""
    lease_name: str = DEFAULT_LEASE_NAME
    """The Lease in `namespace` the replicas elect their leader through."""
    election: ElectionTimings = ElectionTimings()
    daemon_service_account: str = DEFAULT_DAEMON_SERVICE_ACCOUNT
    operator_service_account: str = DEFAULT_OPERATOR_SERVICE_ACCOUNT
    apply_admission_policies: bool = False
    """Create the driver's admission policies at start-up (installs that cannot ship them)."""
    health_host: str = "0.0.0.0"  # noqa: S104 - probes come from the kubelet over the pod IP
    health_port: int = DEFAULT_HEALTH_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    webhook_port: int = 0
    """0 disables the webhook server."""
    webhook_listen: str = "0.0.0.0"  # noqa: S104 - the apiserver reaches it through a Service
    webhook_host: str = ""
    """Name the apiserver uses to reach the webhook; goes into a self-signed certificate."""
    webhook_cert_file: Path | None = None
    webhook_key_file: Path | None = None
    webhook_ca_file: Path | None = None
    webhook_ca_dump: Path | None = None
    """Where to write the CA bundle clients must trust (self-signed or given)."""
    log_level: str = "info"
    log_format: str = "auto"
    write_concurrency: int = 8
    kube_request_timeout: timedelta = timedelta(seconds=60)
    """Timeout of one Kubernetes API request, from connecting (at most 10s of it) to reading
    the whole answer."""
    orphan_grace_period_override: timedelta | None = None
    daemon_tracing: DaemonTracing = NO_TRACING
    """The OpenTelemetry settings the daemon pods get: this process's own `OTEL_*`."""

    @property
    def webhook_enabled(self) -> bool:
        return self.webhook_port > 0


_SECRET_KEY: Final = re.compile(r"[-._a-zA-Z0-9]{1,253}")


def _env(environ: Mapping[str, str], *names: str, default: str = "") -> str:
    for name in names:
        value = environ.get(name)
        if value:
            return value
    return default


def _port(value: str) -> int:
    port = int(value)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, got {value}")
    return port


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="thunder-operator",
        description=(
            "Thunder DRA operator: publishes Thunder inventory as ResourceSlices and "
            "DeviceClasses, runs the node daemon DaemonSet, reaps orphaned Clients and "
            "serves the validating webhook."
        ),
    )
    parser.add_argument(
        "--namespace",
        default=_env(env, "THUNDER_DRA_NAMESPACE", "THUNDER_NAMESPACE", default=DEFAULT_NAMESPACE),
        help="namespace of the daemon DaemonSet and of events "
        "(env THUNDER_DRA_NAMESPACE or THUNDER_NAMESPACE; default %(default)s)",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=Path(env["KUBECONFIG"]) if env.get("KUBECONFIG") else None,
        help="kubeconfig file (env KUBECONFIG); in-cluster configuration when absent",
    )
    parser.add_argument(
        "--cluster-name",
        default=_env(env, "THUNDER_CLUSTER_NAME"),
        help="reconcile only the ThunderCluster of this name (env THUNDER_CLUSTER_NAME); "
        "by default the oldest ThunderCluster is reconciled and any other is reported",
    )
    parser.add_argument(
        "--standalone",
        action="store_true",
        default=_env(env, "THUNDER_STANDALONE") in ("1", "true"),
        help="reconcile without leader election (a single replica; env THUNDER_STANDALONE=1)",
    )
    parser.add_argument(
        "--leader-election-lease",
        dest="lease_name",
        default=_env(env, "THUNDER_LEADER_ELECTION_LEASE", default=DEFAULT_LEASE_NAME),
        help="Lease in --namespace the replicas elect their leader through "
        "(env THUNDER_LEADER_ELECTION_LEASE; default %(default)s)",
    )
    for flag, default, what in (
        ("lease-duration", "15s", "a standby waits after the Lease last changed before taking it"),
        ("renew-deadline", "10s", "the leader keeps trying to renew before it stops reconciling"),
        ("retry-period", "2s", "between attempts to acquire or renew the Lease"),
    ):
        variable = "THUNDER_LEADER_ELECTION_" + flag.upper().replace("-", "_")
        parser.add_argument(
            f"--leader-election-{flag}",
            type=duration,
            default=duration(_env(env, variable, default=default)),
            help=f"time {what} (env {variable}; default {default})",
        )
    parser.add_argument(
        "--daemon-service-account",
        default=_env(env, "THUNDER_DAEMON_SERVICE_ACCOUNT", default=DEFAULT_DAEMON_SERVICE_ACCOUNT),
        help="ServiceAccount of the daemon pods (env THUNDER_DAEMON_SERVICE_ACCOUNT)",
    )
    parser.add_argument(
        "--otel-headers-secret",
        default=_env(env, "THUNDER_OTEL_HEADERS_SECRET"),
        help="Secret in the namespace holding the OTLP exporter headers, which the daemon "
        "pods get as OTEL_EXPORTER_OTLP_HEADERS through a secretKeyRef; without it they get "
        "no headers, since headers may carry credentials (env THUNDER_OTEL_HEADERS_SECRET)",
    )
    parser.add_argument(
        "--otel-headers-secret-key",
        default=_env(env, "THUNDER_OTEL_HEADERS_SECRET_KEY", default=DEFAULT_HEADERS_KEY),
        help="key of the headers in that Secret (env THUNDER_OTEL_HEADERS_SECRET_KEY; "
        "default %(default)s)",
    )
    parser.add_argument(
        "--operator-service-account",
        default=_env(
            env, "THUNDER_OPERATOR_SERVICE_ACCOUNT", default=DEFAULT_OPERATOR_SERVICE_ACCOUNT
        ),
        help="this operator's own ServiceAccount, named in the admission policies "
        "(env THUNDER_OPERATOR_SERVICE_ACCOUNT)",
    )
    parser.add_argument(
        "--apply-admission-policies",
        action="store_true",
        default=_env(env, "THUNDER_APPLY_ADMISSION_POLICIES") in ("1", "true"),
        help="create or update the driver's ValidatingAdmissionPolicies at start-up, for "
        "installs that cannot ship them such as OLM (env THUNDER_APPLY_ADMISSION_POLICIES=1)",
    )
    parser.add_argument(
        "--health-port",
        type=_port,
        default=_port(_env(env, "THUNDER_HEALTH_PORT", default=str(DEFAULT_HEALTH_PORT))),
        help="port of /healthz and /readyz (env THUNDER_HEALTH_PORT; default %(default)s)",
    )
    parser.add_argument(
        "--health-host",
        default="0.0.0.0",  # noqa: S104 - the kubelet probes over the pod IP
        help="address the probe and metrics servers listen on (default %(default)s)",
    )
    parser.add_argument(
        "--metrics-port",
        type=_port,
        default=_port(_env(env, "THUNDER_METRICS_PORT", default=str(DEFAULT_METRICS_PORT))),
        help="port of /metrics (env THUNDER_METRICS_PORT; default %(default)s); "
        "may equal --health-port",
    )
    parser.add_argument(
        "--webhook-port",
        type=_port,
        default=_port(_env(env, "THUNDER_WEBHOOK_PORT", default="0")),
        help="serve the validating webhook over TLS on this port (env THUNDER_WEBHOOK_PORT); "
        "0 (default) disables it",
    )
    parser.add_argument(
        "--webhook-listen",
        default=_env(env, "THUNDER_WEBHOOK_LISTEN", default="0.0.0.0"),  # noqa: S104
        help="address the webhook listens on (default %(default)s)",
    )
    parser.add_argument(
        "--webhook-host",
        default=_env(env, "THUNDER_WEBHOOK_HOST"),
        help="host name or IP the apiserver uses for the webhook; with no certificate "
        "given, a self-signed one is made for it",
    )
    cert_dir = _env(env, "THUNDER_WEBHOOK_CERT_DIR")
    parser.add_argument(
        "--webhook-cert-dir",
        type=Path,
        default=Path(cert_dir) if cert_dir else None,
        help=f"directory holding {CERT_FILE_IN_DIR}, {KEY_FILE_IN_DIR} and optionally "
        f"{CA_FILE_IN_DIR} (env THUNDER_WEBHOOK_CERT_DIR, a mounted kubernetes.io/tls Secret)",
    )
    parser.add_argument("--webhook-cert-file", type=Path, help="webhook serving certificate")
    parser.add_argument("--webhook-key-file", type=Path, help="webhook serving key")
    parser.add_argument("--webhook-ca-file", type=Path, help="CA bundle clients trust")
    parser.add_argument(
        "--webhook-ca-dump", type=Path, help="write the CA bundle clients must trust to this file"
    )
    parser.add_argument(
        "--log-level",
        default=_env(env, "THUNDER_LOG_LEVEL", default="info"),
        choices=("debug", "info", "warning", "error"),
        help="(env THUNDER_LOG_LEVEL; default %(default)s)",
    )
    parser.add_argument(
        "--log-format",
        default=_env(env, "THUNDER_LOG_FORMAT", default="auto"),
        choices=("auto", "json", "text"),
        help="json, text, or auto: json unless stderr is a terminal (env THUNDER_LOG_FORMAT)",
    )
    parser.add_argument(
        "--write-concurrency",
        type=int,
        default=int(_env(env, "THUNDER_WRITE_CONCURRENCY", default="8")),
        help="most Kubernetes writes in flight while publishing (default %(default)s)",
    )
    parser.add_argument(
        "--kube-request-timeout",
        type=duration,
        default=duration(_env(env, "THUNDER_KUBE_REQUEST_TIMEOUT", default="60s")),
        help="timeout of one Kubernetes API request, the whole answer read; a loop whose "
        "request times out retries with backoff (env THUNDER_KUBE_REQUEST_TIMEOUT; "
        "default 60s)",
    )
    return parser


def parse_options(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> OperatorOptions:
    parser = build_parser(environ)
    args = parser.parse_args(argv)
    headers_secret = None
    if args.otel_headers_secret:
        if not syntax.is_dns_subdomain(args.otel_headers_secret):
            parser.error(
                f"--otel-headers-secret must be a Secret name, got {args.otel_headers_secret!r}"
            )
        if not _SECRET_KEY.fullmatch(args.otel_headers_secret_key):
            parser.error(
                "--otel-headers-secret-key must be a Secret key (letters, digits, '-', '_', "
                f"'.'), got {args.otel_headers_secret_key!r}"
            )
        headers_secret = SecretKey(args.otel_headers_secret, args.otel_headers_secret_key)
    cert_file, key_file, ca_file = (
        args.webhook_cert_file,
        args.webhook_key_file,
        args.webhook_ca_file,
    )
    if args.webhook_cert_dir is not None:
        cert_file = cert_file or args.webhook_cert_dir / CERT_FILE_IN_DIR
        key_file = key_file or args.webhook_cert_dir / KEY_FILE_IN_DIR
        bundled_ca = args.webhook_cert_dir / CA_FILE_IN_DIR
        if ca_file is None and bundled_ca.is_file():
            ca_file = bundled_ca
    if (cert_file is None) != (key_file is None):
        parser.error("--webhook-cert-file and --webhook-key-file go together")
    if args.write_concurrency < 1:
        parser.error("--write-concurrency must be at least 1")
    if not 1 <= args.kube_request_timeout.total_seconds() <= 3600:
        parser.error("--kube-request-timeout must be 1s to 1h")
    if not args.lease_name:
        parser.error("--leader-election-lease must not be empty")
    try:
        election = ElectionTimings(
            lease_duration=args.leader_election_lease_duration.total_seconds(),
            renew_deadline=args.leader_election_renew_deadline.total_seconds(),
            retry_period=args.leader_election_retry_period.total_seconds(),
        )
    except ValueError as exc:
        parser.error(str(exc))
    return OperatorOptions(
        namespace=args.namespace,
        kubeconfig=args.kubeconfig,
        cluster_name=args.cluster_name,
        standalone=args.standalone,
        lease_name=args.lease_name,
        election=election,
        daemon_service_account=args.daemon_service_account,
        operator_service_account=args.operator_service_account,
        apply_admission_policies=args.apply_admission_policies,
        health_host=args.health_host,
        health_port=args.health_port,
        metrics_port=args.metrics_port,
        webhook_port=args.webhook_port,
        webhook_listen=args.webhook_listen,
        webhook_host=args.webhook_host,
        webhook_cert_file=cert_file,
        webhook_key_file=key_file,
        webhook_ca_file=ca_file,
        webhook_ca_dump=args.webhook_ca_dump,
        log_level=args.log_level,
        log_format=args.log_format,
        write_concurrency=args.write_concurrency,
        kube_request_timeout=args.kube_request_timeout,
        daemon_tracing=DaemonTracing.from_environment(
            os.environ if environ is None else environ, headers_secret
        ),
    )
