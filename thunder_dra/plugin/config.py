"""The daemon's settings: command-line flags and environment, parsed once at start-up.

The operator's DaemonSet passes the flags; secrets and identities come from the
environment (``THUNDER_API_TOKEN``, ``NODE_NAME``, ``POD_UID``). Everything the daemon
writes on the node is derived here from four directories (plugin root, registry, CDI,
state), so ``docs/daemon.md`` and this module describe the same layout.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from thunder_dra.api.duration import format_duration
from thunder_dra.api.syntax import url_problem
from thunder_dra.kube import naming
from thunder_dra.plugin.files.cdi import NodeGpuFiles
from thunder_dra.plugin.files.layout import ClaimLayout
from thunder_dra.process.flags import FlagDuration, duration_or_seconds
from thunder_dra.thunder import DEFAULT_API_URL, DEFAULT_ARTIFACT_BASE_URL, Secret

DEFAULT_TELEMETRY_URL = "https://telemetry.thundercompute.com:2096"
TOKEN_ENV = "THUNDER_API_TOKEN"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_INSTANCE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
DURATION_FLAGS = (
    "--thunder-timeout",
    "--thunder-retry-initial-backoff",
    "--thunder-retry-max-backoff",
    "--thunder-retry-budget",
    "--thunderd-check-interval",
    "--enrollment-retry-max",
    "--sweep-interval",
    "--install-timeout",
    "--kube-timeout",
)


class ConfigError(ValueError):
    """A flag or environment variable is missing or malformed; the message names it."""


@dataclass(frozen=True)
class ThunderTuning:
    """Per-request timeout and retry policy of Thunder calls (thunder-api.md 1.1, 1.3)."""

    timeout: float = 30.0
    max_attempts: int = 5
    initial_backoff: float = 0.5
    max_backoff: float = 8.0
    budget: float = 60.0


@dataclass(frozen=True)
class Intervals:
    """How often background loops run, in seconds."""

    thunderd_check: float = 30.0
    enrollment_retry_max: float = 300.0
    sweep: float = 30.0
    install_timeout: float = 900.0


@dataclass(frozen=True)
class DaemonConfig:
    driver_name: str
    node_name: str
    instance_id: str
    api_url: str
    artifact_base_url: str
    telemetry_url: str
    plugin_dir_root: Path
    registry_dir: Path
    cdi_dir: Path
    state_dir: Path
    min_driver_version: int
    thunderd_port_range: tuple[int, int] | None
    advertised_ip_label: str
    health_address: str
    health_port: int
    host_runner: str
    host_root: Path
    host_path_prefix: tuple[Path, ...]
    host_env: Mapping[str, str]
    log_level: str
    log_format: str
    api_token: Secret = field(repr=False)
    kubeconfig: Path | None = None
    pod_namespace: str = ""
    node_gpu_files: NodeGpuFiles = field(default_factory=NodeGpuFiles)
    ca_bundle: Path | None = None
    thunder: ThunderTuning = field(default_factory=ThunderTuning)
    intervals: Intervals = field(default_factory=Intervals)
    claim_concurrency: int = 20  # claims prepared or unprepared at once, per daemon
    kube_timeout: float = 20.0  # seconds per Kubernetes request
    installer_sha256: str | None = None
    library_sha256: str | None = None
    enroll_before_binding: bool = False
    """Enroll claims allocated to this node while the scheduler waits to bind their pods
    (``--enroll-before-binding``; :mod:`thunder_dra.plugin.claims.binding`)."""
    node_role: str = "auto"
    """``auto``: the node's serving label decides; ``consumer``: never enroll the node (the
    consumer DaemonSet's pods, which have no access to the host's namespaces)."""
    bare_seconds_flags: Mapping[str, str] = field(default_factory=dict)
    """Duration flags given in bare seconds (deprecated), each with its Go spelling."""

    # Everything below is a fixed layout under the four directories.

    @property
    def plugin_dir(self) -> Path:
        """``<plugin-dir-root>/<driver>``: the DRA socket lives here."""
        return self.plugin_dir_root / self.driver_name

    @property
    def installer_url(self) -> str:
        return f"{self.artifact_base_url}/install.sh"

    @property
    def checkpoint_dir(self) -> Path:
        return self.state_dir

    @property
    def journal_root(self) -> Path:
        """``<state>/journal/<instance id>/`` per daemon instance."""
        return self.state_dir / "journal"

    @property
    def claims_dir(self) -> Path:
        """``<state>/claims/<claim uid>/config.json``."""
        return self.state_dir / "claims"

    @property
    def claim_layout(self) -> ClaimLayout:
        """Where each pod claim's files go (its directory, ``config.json``, CDI spec)."""
        return ClaimLayout(claims_dir=self.claims_dir, cdi_dir=self.cdi_dir)

    def present_gpu_files(self) -> NodeGpuFiles:
        """The configured node GPU files that exist on the host now (a missing bind
        source would make the runtime fail the container)."""
        files = self.node_gpu_files

        def present(path: Path | None) -> Path | None:
            if path is None:
                return None
            seen = self.host_root / path.relative_to("/")
            return path if seen.exists() else None

        return NodeGpuFiles(
            nvidia_smi=present(files.nvidia_smi),
            libcuda=present(files.libcuda),
            libnvidia_ml=present(files.libnvidia_ml),
        )

    @property
    def library_cache_dir(self) -> Path:
        """``<state>/libthunder/sha256/<digest>/libthunder.so``."""
        return self.state_dir / "libthunder"

    @property
    def serialize_lock(self) -> Path:
        return self.state_dir / "serialize.lock"

    @property
    def node_enrollment_file(self) -> Path:
        return self.state_dir / "node-enrollment.json"

    @property
    def enrollment_lock(self) -> Path:
        """Held while an instance checks, restarts or installs thunderd on this node."""
        return self.state_dir / "enrollment.lock"


def _port_range(value: str) -> tuple[int, int] | None:
    if value in ("", "none"):
        return None
    start, sep, end = value.partition("-")
    if not (sep and start.isdigit() and end.isdigit()):
        raise argparse.ArgumentTypeError(f"want START-END, got {value!r}")
    first, last = int(start), int(end)
    if not 1 <= first <= last <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not within 1-65535 with START <= END")
    return first, last


def _env_pair(value: str) -> tuple[str, str]:
    name, sep, content = value.partition("=")
    if not sep or not _ENV_NAME.match(name):
        raise argparse.ArgumentTypeError(f"want NAME=VALUE, got {value!r}")
    return name, content


def _url(value: str) -> str:
    trimmed = value.strip().rstrip("/")
    if not trimmed.startswith(("https://", "http://")):
        raise argparse.ArgumentTypeError(f"must be an http(s) URL, got {value!r}")
    return trimmed


def _artifact_url(value: str) -> str:
    trimmed = _url(value)
    problem = url_problem(trimmed)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{value!r} {problem}")
    return trimmed


def _sha256(value: str) -> str:
    if not _SHA256.match(value):
        raise argparse.ArgumentTypeError(f"want 64 lower-case hex digits, got {value!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="thunder-daemon",
        description="Thunder DRA kubelet plugin and node enrollment daemon.",
    )
    add = parser.add_argument
    add("--driver-name", default=naming.DRIVER_NAME)
    add("--api-url", type=_url, default=DEFAULT_API_URL, help="Thunder API base URL")
    add("--artifact-base-url", type=_artifact_url, default=DEFAULT_ARTIFACT_BASE_URL)
    add("--installer-sha256", type=_sha256, help="pinned SHA-256 of the Thunder installer")
    add("--library-sha256", type=_sha256, help="pinned SHA-256 of libthunder.so")
    add("--telemetry-url", type=_url, default=DEFAULT_TELEMETRY_URL)
    add("--plugin-dir-root", type=Path, default=Path("/var/lib/kubelet/plugins"))
    add("--registry-dir", type=Path, default=Path("/var/lib/kubelet/plugins_registry"))
    add("--cdi-dir", type=Path, default=Path("/var/run/cdi"))
    add("--state-dir", type=Path, default=Path("/var/lib/thunder-dra"))
    add("--min-driver-version", type=int, default=610)
    add("--thunderd-port-range", type=_port_range, default=(32000, 32199))
    add("--advertised-ip-label", default=naming.NODE_LABEL_ADVERTISED_IP)
    # All interfaces: the kubelet's probes and Prometheus reach the pod IP.
    add("--health-address", default="0.0.0.0", help="address of /healthz, /readyz, /metrics")  # noqa: S104
    add("--health-port", type=int, default=8081)
    add("--host-runner", choices=("nsenter", "local"), default="nsenter")
    add(
        "--node-role",
        choices=("auto", "consumer"),
        default="auto",
        help="consumer: never enroll this node, whatever its labels (auto: its labels decide)",
    )
    add(
        "--host-root",
        type=Path,
        help="where the host's filesystem is visible (default /proc/1/root with nsenter, / else)",
    )
    add("--host-path-prefix", type=Path, action="append", default=[], help="local runner PATH")
    add("--host-env", type=_env_pair, action="append", default=[], help="NAME=VALUE (local runner)")
    add("--instance-id", default=None, help="default: $POD_UID")
    add("--nvidia-smi-path", type=Path, help="host path mounted at /usr/local/bin/nvidia-smi")
    add("--libcuda-path", type=Path, help="host path of libcuda.so.1 (mounted if present)")
    add("--libnvidia-ml-path", type=Path, help="host path of libnvidia-ml.so.1")
    add("--ca-bundle-path", type=Path, help="opt-in: host CA bundle mounted over the image's")
    add("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    add("--log-format", choices=("auto", "json", "text"), default="auto")
    # Durations: Go syntax ("30s", "1m30s", "500ms"); bare seconds are still read (deprecated).
    add("--thunder-timeout", type=duration_or_seconds, default="30s", help="per Thunder request")
    add("--thunder-retry-attempts", type=int, default=5)
    add("--thunder-retry-initial-backoff", type=duration_or_seconds, default="500ms")
    add("--thunder-retry-max-backoff", type=duration_or_seconds, default="8s")
    add("--thunder-retry-budget", type=duration_or_seconds, default="60s")
    add("--thunderd-check-interval", type=duration_or_seconds, default="30s")
    add("--enrollment-retry-max", type=duration_or_seconds, default="5m")
    add("--sweep-interval", type=duration_or_seconds, default="30s")
    add("--install-timeout", type=duration_or_seconds, default="15m")
    add("--claim-concurrency", type=int, default=20, help="claims worked on at once (1-256)")
    add("--kube-timeout", type=duration_or_seconds, default="20s", help="per Kubernetes request")
    add(
        "--enroll-before-binding",
        action="store_true",
        help="enroll claims allocated to this node while the scheduler waits to bind their pods",
    )
    return parser


def _absolute(name: str, path: Path | None) -> Path | None:
    if path is not None and not path.is_absolute():
        raise ConfigError(f"{name} must be an absolute path, got {path}")
    return path


def _check_flags(args: argparse.Namespace) -> None:
    """The checks argparse cannot make; raises :class:`ConfigError` naming the flag."""
    for name in ("plugin_dir_root", "registry_dir", "cdi_dir", "state_dir"):
        _absolute(f"--{name.replace('_', '-')}", getattr(args, name).absolute())
    if args.min_driver_version < 1:
        raise ConfigError("--min-driver-version must be positive")
    if not 1 <= args.claim_concurrency <= 256:
        raise ConfigError(f"--claim-concurrency {args.claim_concurrency} is not within 1-256")
    if args.thunder_retry_attempts < 1:
        raise ConfigError("--thunder-retry-attempts must be at least 1")
    if not 0 <= args.health_port <= 65535:
        raise ConfigError(f"--health-port {args.health_port} is not a port")
    try:
        ipaddress.ip_address(args.health_address)
    except ValueError as err:
        raise ConfigError(f"--health-address {args.health_address!r} is not an IP") from err


def parse_config(argv: Sequence[str] | None, env: Mapping[str, str]) -> DaemonConfig:
    """Flags and environment to a :class:`DaemonConfig`; raises :class:`ConfigError`."""
    args = build_parser().parse_args(argv)
    node_name = env.get("NODE_NAME", "").strip()
    if not node_name:
        raise ConfigError("NODE_NAME is not set (the DaemonSet sets it from spec.nodeName)")
    instance_id = (args.instance_id or env.get("POD_UID", "")).strip()
    if not instance_id:
        raise ConfigError("no instance ID: pass --instance-id or set POD_UID")
    if not _INSTANCE_ID.match(instance_id):
        raise ConfigError(f"instance ID {instance_id!r} must be 1-63 of [A-Za-z0-9._-]")
    token = Secret(env.get(TOKEN_ENV, "")).stripped()
    if not token:
        raise ConfigError(f"{TOKEN_ENV} is not set (the DaemonSet reads it from the Secret)")
    _check_flags(args)
    host_root = args.host_root or Path("/proc/1/root" if args.host_runner == "nsenter" else "/")
    gpu_files = NodeGpuFiles(
        nvidia_smi=_absolute("--nvidia-smi-path", args.nvidia_smi_path),
        libcuda=_absolute("--libcuda-path", args.libcuda_path),
        libnvidia_ml=_absolute("--libnvidia-ml-path", args.libnvidia_ml_path),
    )
    kubeconfig = env.get("KUBECONFIG", "").strip()
    durations: dict[str, FlagDuration] = {
        flag: getattr(args, flag[2:].replace("-", "_")) for flag in DURATION_FLAGS
    }
    seconds = {flag: value.seconds for flag, value in durations.items()}
    return DaemonConfig(
        driver_name=args.driver_name,
        node_name=node_name,
        instance_id=instance_id,
        api_url=args.api_url,
        artifact_base_url=args.artifact_base_url,
        telemetry_url=args.telemetry_url,
        plugin_dir_root=args.plugin_dir_root.absolute(),
        registry_dir=args.registry_dir.absolute(),
        cdi_dir=args.cdi_dir.absolute(),
        state_dir=args.state_dir.absolute(),
        min_driver_version=args.min_driver_version,
        thunderd_port_range=args.thunderd_port_range,
        advertised_ip_label=args.advertised_ip_label,
        health_address=args.health_address,
        health_port=args.health_port,
        host_runner=args.host_runner,
        host_root=host_root,
        host_path_prefix=tuple(p.absolute() for p in args.host_path_prefix),
        host_env=dict(args.host_env),
        log_level=args.log_level,
        log_format=args.log_format,
        api_token=token,
        kubeconfig=Path(kubeconfig) if kubeconfig else None,
        pod_namespace=env.get("POD_NAMESPACE", ""),
        node_gpu_files=gpu_files,
        ca_bundle=_absolute("--ca-bundle-path", args.ca_bundle_path),
        thunder=ThunderTuning(
            timeout=seconds["--thunder-timeout"],
            max_attempts=args.thunder_retry_attempts,
            initial_backoff=seconds["--thunder-retry-initial-backoff"],
            max_backoff=max(
                seconds["--thunder-retry-max-backoff"], seconds["--thunder-retry-initial-backoff"]
            ),
            budget=seconds["--thunder-retry-budget"],
        ),
        intervals=Intervals(
            thunderd_check=seconds["--thunderd-check-interval"],
            enrollment_retry_max=seconds["--enrollment-retry-max"],
            sweep=seconds["--sweep-interval"],
            install_timeout=seconds["--install-timeout"],
        ),
        installer_sha256=args.installer_sha256,
        claim_concurrency=args.claim_concurrency,
        kube_timeout=seconds["--kube-timeout"],
        library_sha256=args.library_sha256,
        node_role=args.node_role,
        enroll_before_binding=args.enroll_before_binding,
        bare_seconds_flags={
            flag: format_duration(value.value)
            for flag, value in durations.items()
            if value.bare_seconds
        },
    )


def warn_bare_seconds(config: DaemonConfig, log: logging.Logger) -> None:
    """One warning per duration flag given in bare seconds, once logging is set up: a
    command line written for an earlier release still works, and says what to change."""
    for flag, spelled in config.bare_seconds_flags.items():
        log.warning(
            "a duration flag is given in bare seconds, which is deprecated; write a duration",
            extra={"flag": flag, "read_as": spelled},
        )
