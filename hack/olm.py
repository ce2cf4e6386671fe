"""OLM (Operator Lifecycle Manager v0) on the local control plane, and a catalog it reads.

``hack/build-olm.sh`` builds the olm and catalog operators and opm from the pinned
modules (``make olm``). ``Olm`` installs OLM's CRDs into a cluster and runs the two
operators as processes of this machine with the cluster's admin kubeconfig, as a
cluster's OLM deployment runs them in pods: the olm operator installs a
ClusterServiceVersion (Deployment, RBAC, the webhook's Service, certificate and
configuration), the catalog operator resolves Subscriptions against CatalogSources and
writes InstallPlans. ``CatalogServer`` serves a file-based catalog (``release.catalog``)
with ``opm serve`` on a loopback port, for a CatalogSource of ``spec.address``.

Both operators serve metrics on a fixed port of every address (8080, or 8443 with TLS),
so the olm operator gets a throwaway certificate and takes 8443, the catalog operator
8080. On exit ``Olm`` removes OLM's CRDs (and with them every OLM object left), so the
cluster's later users find no OLM.

    with Olm(cluster, workdir) as olm, CatalogServer(catalog_dir, workdir) as served:
        ...  # a CatalogSource with spec.address = served.address
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Self

from hack import supervise
from hack.cluster.launcher import Cluster, free_port
from hack.tied import tied

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "hack" / "build-olm.sh"
# The catalog operator's global namespace: CatalogSources here serve every namespace.
GLOBAL_NAMESPACE = "olm"
# Ports the two operators take on every address (OLM's pkg/lib/server), fixed upstream.
FIXED_PORTS = (8080, 8443)


class OlmError(RuntimeError):
    """OLM or the catalog server did not start, or stopped."""


@dataclass(frozen=True)
class OlmTools:
    bin: Path
    crds: Path

    def binary(self, name: str) -> Path:
        return self.bin / name


def _print_dir() -> Path:
    done = subprocess.run([str(BUILD), "--print"], capture_output=True, text=True, check=True)
    return Path(done.stdout.strip())


def unavailable() -> str | None:
    """Why OLM cannot run here (not built yet: ``make olm``), or None."""
    root = _print_dir()
    tools = OlmTools(root / "bin", root / "crds")
    missing = [n for n in ("olm", "catalog", "opm") if not os.access(tools.binary(n), os.X_OK)]
    if missing:
        return f"OLM is not built ({', '.join(missing)} missing): run `make olm`"
    busy = [port for port in FIXED_PORTS if _in_use(port)]
    if busy:
        return f"the OLM operators need ports {FIXED_PORTS}, and {busy} are in use"
    return None


def _in_use(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            return True
    return False


@cache
def tools() -> OlmTools:
    """The built tools (building them the first time)."""
    done = subprocess.run([str(BUILD)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise OlmError(f"hack/build-olm.sh failed:\n{done.stderr[-3000:]}")
    root = Path(done.stdout.strip())
    return OlmTools(root / "bin", root / "crds")


def _wait_http(port: int, path: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise OlmError(
                f"{log.stem} exited ({process.returncode}):\n{supervise.log_tail(log, 30)}"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise OlmError(f"{log.stem} did not listen on {port} within 60s ({path})")


class Olm(supervise.Served):
    """OLM's CRDs and its two operators on ``cluster``; see the module's docstring."""

    grace = 15

    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self._processes: list[subprocess.Popen[bytes]] = []

    def kubectl(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(
            [str(self.cluster.bin_dir / "kubectl"), *args],
            env={**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)},
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if check and done.returncode != 0:
            raise OlmError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def start(self) -> Self:
        built = tools()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.kubectl("apply", "--server-side", "-f", str(built.crds))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(built.crds))
        if not self.kubectl("get", "namespace", GLOBAL_NAMESPACE, "--ignore-not-found"):
            self.kubectl("create", "namespace", GLOBAL_NAMESPACE)
        cert, key = self.workdir / "olm-metrics.crt", self.workdir / "olm-metrics.key"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj", "/CN=olm-metrics",
             "-keyout", str(key), "-out", str(cert)],
            check=True, capture_output=True,
        )  # fmt: skip
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}
        commands = {
            # No OpenShift here: no ClusterOperator status to write.
            "olm": [str(built.binary("olm")), f"--namespace={GLOBAL_NAMESPACE}",
                    "--writeStatusName=", "--writePackageServerStatusName=",
                    f"--tls-cert={cert}", f"--tls-key={key}"],
            "catalog": [str(built.binary("catalog")), f"--namespace={GLOBAL_NAMESPACE}",
                        f"--kubeconfig={self.cluster.kubeconfig}", "--writeStatusName=",
                        "--interval=30s"],
        }  # fmt: skip
        try:
            for name, command in commands.items():
                with self.log(name).open("ab") as out:
                    process = subprocess.Popen(
                        tied(command), stdout=out, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL, env=env,
                    )  # fmt: skip
                self._processes.append(process)
                _wait_http(8443 if name == "olm" else 8080, "/healthz", process, self.log(name))
        except BaseException:
            self.stop()
            raise
        return self

    def alive(self) -> None:
        """Raise when either operator has exited."""
        for process, name in zip(self._processes, ("olm", "catalog"), strict=False):
            if process.poll() is not None:
                tail = supervise.log_tail(self.log(name), 30)
                raise OlmError(f"the {name} operator exited ({process.returncode}):\n{tail}")

    def stop(self) -> None:
        for process in self._processes:
            supervise.terminate(process)
        for process in self._processes:
            supervise.reap(process, self.grace)
        self._processes = []
        built = tools()
        self.kubectl("delete", "--ignore-not-found", "--wait=true", "--timeout=120s",
                     "-f", str(built.crds), check=False)  # fmt: skip
        self.kubectl("delete", "namespace", GLOBAL_NAMESPACE, "--ignore-not-found",
                     "--wait=false", check=False)  # fmt: skip


class CatalogServer(supervise.Served):
    """``opm serve`` of a file-based catalog directory on a free port (every address:
    opm takes no listen address; the catalog operator dials 127.0.0.1)."""

    def __init__(self, catalog: Path, workdir: Path, name: str = "opm") -> None:
        self.catalog = catalog
        self.workdir = workdir
        self.name = name
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def start(self) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        command = [
            str(tools().binary("opm")), "serve", str(self.catalog), f"--port={self.port}",
            f"--pprof-addr=127.0.0.1:{free_port()}",
            f"--termination-log={self.workdir / f'{self.name}-termination.log'}",
        ]  # fmt: skip
        with self.log.open("ab") as out:
            self._popen = subprocess.Popen(
                tied(command), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        _wait_http(self.port, "grpc", self._popen, self.log)
        return self
