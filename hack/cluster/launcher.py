"""Start and stop a local Kubernetes control plane built from upstream sources.

etcd, kube-apiserver, kube-scheduler and kube-controller-manager run as plain
processes on free loopback ports, with real TLS, client-certificate
authentication, RBAC and service-account signing keys. There is no kubelet:
tests simulate nodes (see ``hack.cluster.nodes``) and run the project's own
daemons beside them.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hack import supervise
from hack.cluster.pki import CertificateAuthority, KeyPair, service_account_key
from hack.tied import tied

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "hack" / "build-tools.sh"

# The newest version the build serves natively; older ones are emulated.
BINARY_VERSION = "1.37"
EMULATED_VERSIONS = ("1.34", "1.35", "1.36", "1.37")

# DRAExtendedResource is alpha (off) in 1.34 and 1.35, beta (on) in 1.36 and GA in 1.37.
_GATE_NEEDED = {"1.34": ("DRAExtendedResource",), "1.35": ("DRAExtendedResource",)}

CONTROLLERS = (
    "resourceclaim-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "daemonset-controller",
    "deployment-controller",
    "replicaset-controller",
)

_AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "Metadata",
            "verbs": ["create", "update", "patch", "delete", "deletecollection"],
        },
        {"level": "None"},
    ],
}


class ClusterError(RuntimeError):
    """The control plane could not be built, started or reached."""


_built: Path | None = None


def binaries() -> Path:
    """Build the pinned binaries if they are not cached yet and return their directory.

    The script's answer is kept for the rest of the process while the directory exists:
    it hashes the pinned module files and asks `go env` each time, a process or two per
    call, and the test suite asks for helm or kubectl a hundred times."""
    global _built
    if _built is not None and _built.is_dir():
        return _built
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
    )
    if proc.returncode != 0:
        raise ClusterError(f"{BUILD_SCRIPT} failed with exit code {proc.returncode}")
    _built = Path(proc.stdout.strip().splitlines()[-1])
    return _built


def _ephemeral_floor() -> int:
    try:
        low = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]
        return int(low)
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback TCP port that is free now, for a process that binds it a moment later.

    Ports come from below the kernel's ephemeral range: the OS hands ephemeral ports to
    every outgoing connection, so one picked there can be taken by a client socket
    before the server binds it. Below the range only another listener can take it.
    """
    floor = _ephemeral_floor()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(1024, floor - 12000), floor)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ClusterConfig:
    emulated_version: str | None = None
    feature_gates: dict[str, bool] = field(default_factory=dict)
    audit: bool = True
    # Opt-in, for benchmarks: fields of a KubeSchedulerConfiguration
    # (kubescheduler.config.k8s.io/v1) such as {"percentageOfNodesToScore": 10}. The
    # launcher adds clientConnection and leaderElection, which a config file must carry
    # (the scheduler then ignores --kubeconfig). None (the default): no config file.
    scheduler_config: dict[str, Any] | None = None
    # Opt-in: a kube-scheduler binary to run instead of the cached build's.
    scheduler_binary: Path | None = None
    # Opt-in, for a real node (hack.node): the Service range (default: loopback), more
    # IP addresses in the apiserver's serving certificate (e.g. the `kubernetes` Service
    # address on a test bridge), webhook and aggregated-API calls to endpoint IPs
    # (no kube-proxy), nodes that get a kubelet certificate and kubeconfig (and the
    # apiserver a kubelet client certificate), and more kube-controller-manager
    # controllers (e.g. node-lifecycle-controller, which clears the not-ready taint).
    service_cidr: str | None = None
    apiserver_ips: tuple[str, ...] = ()
    aggregator_routing: bool = False
    nodes: tuple[str, ...] = ()
    extra_controllers: tuple[str, ...] = ()
    # Opt-in: serving certificates from the cluster CA, (name, IP addresses) each, for
    # services pods reach over https trusting only their service-account ca.crt (e.g. a
    # fake Thunder on a test bridge). Cluster.server_certs[name] holds the files.
    server_certs: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def gates(self) -> dict[str, bool]:
        gates = dict.fromkeys(_GATE_NEEDED.get(self.emulated_version or BINARY_VERSION, ()), True)
        gates.update(self.feature_gates)
        return gates

    @property
    def version(self) -> str:
        return self.emulated_version or BINARY_VERSION


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


class Cluster:
    """One control plane in one working directory. Use as a context manager."""

    def __init__(
        self,
        workdir: Path | None = None,
        config: ClusterConfig | None = None,
        bin_dir: Path | None = None,
        tie_to_parent: bool = True,
    ) -> None:
        self.config = config or ClusterConfig()
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="thunder-dra-cp-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.bin_dir = bin_dir or binaries()
        self.tie_to_parent = tie_to_parent
        self.kubeconfig = self.workdir / "kubeconfig"
        self.audit_log = self.workdir / "audit.log"
        self.server = ""
        self.scheduler_port = 0
        self.ca_cert = self.workdir / "pki" / "ca.crt"
        # Node name -> kubeconfig of its kubelet (config.nodes).
        self.node_kubeconfigs: dict[str, Path] = {}
        # Name -> serving certificate and key (config.server_certs).
        self.server_certs: dict[str, KeyPair] = {}
        self._procs: list[_Proc] = []

    # -- lifecycle -----------------------------------------------------------------
    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        # A port found free can still be taken before the component binds it; such a
        # start is retried from scratch on new ports rather than failing a test run.
        for attempt in range(3):
            try:
                self._start()
                return
            except ClusterError as err:
                self.stop()
                if "address already in use" not in str(err) or attempt == 2:
                    raise
                shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
            except BaseException:
                self.stop()
                raise

    def _start(self) -> None:
        pki = self.workdir / "pki"
        pki.mkdir(exist_ok=True)
        ca = CertificateAuthority(pki)
        serving = ca.issue(
            "apiserver",
            "kube-apiserver",
            dns_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            ip_addresses=("127.0.0.1", "127.254.0.1", *self.config.apiserver_ips),
            server=True,
        )
        sa_key, sa_pub = service_account_key(pki)
        admin = ca.issue("admin", "thunder-dra-admin", organizations=("system:masters",))
        scheduler_cert = ca.issue("scheduler", "system:kube-scheduler")
        kcm_cert = ca.issue("controller-manager", "system:kube-controller-manager")
        # The front-proxy CA lets aggregated servers and webhooks trust requests the
        # apiserver forwards, as on a kubeadm cluster.
        proxy_dir = pki / "front-proxy"
        proxy_dir.mkdir(exist_ok=True)
        proxy_ca = CertificateAuthority(proxy_dir, name="thunder-dra-front-proxy-ca")
        proxy_client = proxy_ca.issue("client", "front-proxy-client")

        etcd_port, api_port = free_port(), free_port()
        self.server = f"https://127.0.0.1:{api_port}"
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._spawn(
            "etcd",
            [
                "--name=local",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{free_port()}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{free_port()}",
                "--unsafe-no-fsync",
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
        )
        self._wait_http(f"{etcd_url}/health", "etcd", timeout=60)

        common = self._common_flags()
        api_args = [
            f"--etcd-servers={etcd_url}",
            f"--etcd-prefix=/{uuid.uuid4()}/registry",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={api_port}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={ca.cert_path}",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            "--api-audiences=https://kubernetes.default.svc.cluster.local",
            # Services get loopback ClusterIPs: when the apiserver calls a webhook or an
            # aggregated API through a Service, it dials an address on this machine, where
            # nothing listens, and never a private-range address on some real network.
            f"--service-cluster-ip-range={self.config.service_cidr or '127.254.0.0/24'}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            f"--requestheader-client-ca-file={proxy_ca.cert_path}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={proxy_client.cert}",
            f"--proxy-client-key-file={proxy_client.key}",
            *common,
        ]
        if self.config.aggregator_routing:
            api_args.append("--enable-aggregator-routing=true")
        node_certs = {
            name: ca.issue(f"node-{name}", f"system:node:{name}", organizations=("system:nodes",))
            for name in self.config.nodes
        }
        for name, ips in self.config.server_certs:
            self.server_certs[name] = ca.issue(
                f"server-{name}", name, ip_addresses=ips, server=True
            )
        if node_certs:
            kubelet_client = ca.issue(
                "apiserver-kubelet-client",
                "kube-apiserver-kubelet-client",
                organizations=("system:masters",),
            )
            api_args += [
                f"--kubelet-client-certificate={kubelet_client.cert}",
                f"--kubelet-client-key={kubelet_client.key}",
                # Never resolve a node's name through the machine's resolver.
                "--kubelet-preferred-address-types=InternalIP",
            ]
        if self.config.audit:
            policy = self.workdir / "audit-policy.yaml"
            policy.write_text(yaml.safe_dump(_AUDIT_POLICY))
            api_args += [
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
            ]
        self._spawn("kube-apiserver", api_args)

        self._write_kubeconfig(self.kubeconfig, ca.cert_path, admin.cert, admin.key, "admin")
        sched_kc = self.workdir / "scheduler.kubeconfig"
        self._write_kubeconfig(
            sched_kc, ca.cert_path, scheduler_cert.cert, scheduler_cert.key, "sched"
        )
        kcm_kc = self.workdir / "controller-manager.kubeconfig"
        self._write_kubeconfig(kcm_kc, ca.cert_path, kcm_cert.cert, kcm_cert.key, "kcm")
        for name, pair in node_certs.items():
            path = self.workdir / f"node-{name}.kubeconfig"
            self._write_kubeconfig(path, ca.cert_path, pair.cert, pair.key, f"node-{name}")
            self.node_kubeconfigs[name] = path
        self._wait_apiserver(ca.cert_path, admin.cert, admin.key)

        sched_port, kcm_port = free_port(), free_port()
        self.scheduler_port = sched_port
        self._spawn(
            "kube-scheduler",
            [
                f"--kubeconfig={sched_kc}",
                f"--authentication-kubeconfig={sched_kc}",
                f"--authorization-kubeconfig={sched_kc}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={sched_port}",
                *self._scheduler_config_flags(sched_kc),
                *common,
            ],
            binary=self.config.scheduler_binary,
        )
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={kcm_kc}",
                f"--authentication-kubeconfig={kcm_kc}",
                f"--authorization-kubeconfig={kcm_kc}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={kcm_port}",
                f"--controllers={','.join((*CONTROLLERS, *self.config.extra_controllers))}",
                f"--service-account-private-key-file={sa_key}",
                f"--root-ca-file={ca.cert_path}",
                "--use-service-account-credentials=true",
                *common,
            ],
        )
        self._wait_http(f"https://127.0.0.1:{sched_port}/healthz", "kube-scheduler", timeout=90)
        self._wait_http(
            f"https://127.0.0.1:{kcm_port}/healthz", "kube-controller-manager", timeout=90
        )

    def _scheduler_config_flags(self, kubeconfig: Path) -> list[str]:
        if self.config.scheduler_config is None:
            return []
        config: dict[str, Any] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            **self.config.scheduler_config,
            "clientConnection": {
                **self.config.scheduler_config.get("clientConnection", {}),
                "kubeconfig": str(kubeconfig),
            },
            "leaderElection": {"leaderElect": False},
        }
        path = self.workdir / "scheduler-config.yaml"
        path.write_text(yaml.safe_dump(config))
        return [f"--config={path}"]

    def _common_flags(self) -> list[str]:
        flags = []
        gates = self.config.gates()
        if gates:
            flags.append(
                "--feature-gates="
                + ",".join(f"{k}={str(v).lower()}" for k, v in sorted(gates.items()))
            )
        if self.config.emulated_version:
            flags.append(f"--emulated-version={self.config.emulated_version}")
        return flags

    def stop(self) -> None:
        for proc in reversed(self._procs):
            supervise.terminate(proc.popen)
        deadline = time.monotonic() + 15
        for proc in reversed(self._procs):
            supervise.reap(proc.popen, max(0.1, deadline - time.monotonic()))
        self._procs.clear()

    # -- helpers -------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """Environment for tools and processes that should use this control plane."""
        return {
            "KUBECONFIG": str(self.kubeconfig),
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def logs(self, name: str) -> str:
        for proc in self._procs:
            if proc.name == name:
                return supervise.read_log(proc.log)
        raise KeyError(name)

    @property
    def pids(self) -> dict[str, int]:
        return {p.name: p.popen.pid for p in self._procs}

    def audit_events(self) -> list[dict[str, object]]:
        """The apiserver's audit events so far (write verbs only, per the policy)."""
        if not self.audit_log.exists():
            return []
        events: list[dict[str, object]] = []
        for line in self.audit_log.read_text().splitlines():
            if line.strip():
                events.append(json.loads(line))
        return events

    def _spawn(self, name: str, args: list[str], binary: Path | None = None) -> None:
        log = self.workdir / f"{name}.log"
        with log.open("ab") as out:
            command = [str(binary or self.bin_dir / name), *args]
            # Tied to this run unless asked otherwise: if the test run is killed
            # outright, its control plane goes too.
            popen = subprocess.Popen(
                tied(command, "TERM") if self.tie_to_parent else command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._procs.append(_Proc(name, popen, log))

    def _check_alive(self) -> None:
        for proc in self._procs:
            code = proc.popen.poll()
            if code is not None:
                tail = supervise.log_tail(proc.log, 25)
                raise ClusterError(f"{proc.name} exited with code {code}; last lines:\n{tail}")

    def _wait_http(self, url: str, name: str, timeout: float) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        self._poll(url, name, timeout, ctx)

    def _wait_apiserver(self, ca: Path, cert: Path, key: Path) -> None:
        ctx = ssl.create_default_context(cafile=str(ca))
        ctx.load_cert_chain(str(cert), str(key))
        self._poll(f"{self.server}/readyz", "kube-apiserver", 120, ctx)

    def _poll(self, url: str, name: str, timeout: float, ctx: ssl.SSLContext) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(url, context=ctx, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError) as err:
                last = str(err)
            time.sleep(0.25)
        raise ClusterError(f"{name} not ready at {url} after {timeout:.0f}s: {last}")

    def _write_kubeconfig(self, path: Path, ca: Path, cert: Path, key: Path, user: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "thunder-dra-local",
                    "cluster": {"server": self.server, "certificate-authority": str(ca)},
                }
            ],
            "users": [
                {"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}
            ],
            "contexts": [
                {
                    "name": "thunder-dra-local",
                    "context": {"cluster": "thunder-dra-local", "user": user},
                }
            ],
            "current-context": "thunder-dra-local",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
