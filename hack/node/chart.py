"""The README's install on a real node (``hack.node.Node``), for the tests and ``make demo``.

The chart is installed by running the README's Install commands as they are written
(``readme_install``: namespace, token Secret from a file, CRDs with ``kubectl apply
--server-side``, ``helm install``), with a token file and the test's values added to
``helm install``: the images ``make image`` built (imported into the node's
containerd, ``pullPolicy: Never``) and the fake Thunder as the API. The fake listens on
the node's bridge address over https with a certificate from the cluster CA
(``Cluster.server_certs``): the driver refuses plain http to anything but loopback, and
the operator and daemon pods trust that CA through their service-account ``ca.crt``
(``SSL_CERT_FILE`` in the chart's ``extraEnv``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from hack import image as image_builder
from hack.fake_host import FakeHost
from hack.fake_host.state import THUNDER_FILE
from hack.fake_thunder import FakeThunderProcess, start_fake_thunder
from hack.fake_thunder.library import loader_errors, preloaded_lines
from hack.node import launcher
from hack.node.launcher import Node

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
# What the README's Secret command reads the token from.
TOKEN_FILE = "./thunder-api-token"
CHART = REPO / "charts" / "thunder-device-plugin"
POD_CHART = REPO / "charts" / "tests" / "pod"
VM_CHART = REPO / "charts" / "tests" / "vm"
# KubeVirt's VirtualMachine and VirtualMachineInstance kinds, for the vm test chart.
KUBEVIRT_CRDS = Path(__file__).with_name("kubevirt-crds.yaml")
NAMESPACE = "thunder-system"
RELEASE = "thunder-device-plugin"
API_TOKEN = "tcapi_real_node_Secret-API-token-5c1e"
SA_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
# The serving node's zone and role, as a platform team labels a GPU server.
NODE_LABELS = {"topology.kubernetes.io/zone": "zone-a", "thundercompute.com/node": "true"}
ZONE = NODE_LABELS["topology.kubernetes.io/zone"]
KUBECTL_VERSION = "v1.37.2"
DAEMON_SET = "thunder-dra-daemon"
# The kubelet's event when NodePrepareResources fails (pkg/kubelet/events), and its log line.
FAILED_PREPARE = "FailedPrepareDynamicResources"
FAILED_PREPARE_LOG = "Failed to prepare dynamic resources"
T = TypeVar("T")

# What a workload's own output shows of the driver's injection: the two files at their
# container paths, LD_PRELOAD, the library's digest, config.json's keys (never its
# values: they hold the client's credentials) and its environment.
INJECTED = r"""
ls -l /etc/thunder/
echo "LD_PRELOAD=$LD_PRELOAD"
sha256sum /etc/thunder/libthunder.so
python3 -c 'import json; c = json.load(open("/etc/thunder/config.json"))
print("config.json keys:", sorted(c))'
env | sort
"""


def node_config_for_chart(cluster_ca: Path, images: tuple[Path, ...]) -> launcher.NodeConfig:
    """A serving node whose fake host tools reach an https fake Thunder."""
    return launcher.NodeConfig(
        images=images,
        node_labels=dict(NODE_LABELS),
        host_env={"SSL_CERT_FILE": str(cluster_ca)},
    )


def node_images(kubectl: Path) -> dict[str, image_builder.BuiltImage]:
    """Operator, daemon, stock Debian and kubectl images (built once, cached)."""
    images = image_builder.build()
    images["stock"] = image_builder.stock_image()
    images["kubectl"] = image_builder.build_kubectl(kubectl, KUBECTL_VERSION)
    return images


def wait(check: Callable[[], T | None], what: str, timeout: float = 180) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(1)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


@dataclass
class Install:
    node: Node
    fake: FakeThunderProcess
    images: dict[str, image_builder.BuiltImage]
    install_output: str
    workdir: Path
    # The chart values installed (helm -f), for an upgrade that changes some of them.
    values: dict[str, Any] = field(default_factory=dict)

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> str:
        done = subprocess.run(
            [str(self.node.cluster.bin_dir / "helm"), *args],
            env={**os.environ, "KUBECONFIG": str(self.node.cluster.kubeconfig)},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args)}: {done.stdout}\n{done.stderr}")
        return done.stdout + done.stderr

    def get(self, *args: str) -> Any:
        out = self.node.kubectl("get", *args, "-o", "json", check=False)
        return json.loads(out) if out else None

    def secrets(self) -> list[str]:
        """Every credential the fake knows: the API token, enrollment and client tokens."""
        state = self.fake.admin.state()
        found = [t["token"] for t in state.get("apiTokens", [])]
        found += [t.get("enrollmentToken") or "" for t in state.get("enrollmentTokens", [])]
        found += [c.get("authToken") or "" for c in state.get("clients", [])]
        return [s for s in found if s]

    def daemon_pods(self) -> list[dict[str, Any]]:
        pods = self.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=daemon")
        return list((pods or {}).get("items", []))

    def ready_daemon_pod(self) -> dict[str, Any] | None:
        for pod in self.daemon_pods():
            conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
            if conditions.get("Ready") == "True":
                return pod
        return None

    def enrolled_host(self) -> dict[str, Any] | None:
        for item in self.fake.admin.state().get("hosts", []):
            if item.get("hostname") == self.node.config.name:
                return dict(item)
        return None

    def zone_id(self) -> str | None:
        zones = self.fake.admin.state().get("zones", [])
        return next((str(z["zoneId"]) for z in zones if z["displayName"] == ZONE), None)

    def claims_gone(self, namespace: str) -> bool:
        clients = self.get("clients.thundercompute.com", "-n", namespace) or {"items": [1]}
        claims = self.get("resourceclaims", "-n", namespace) or {"items": [1]}
        return not clients["items"] and not claims["items"]

    def wait_claims_gone(self, namespace: str) -> None:
        """Until the namespace has no ResourceClaim and no Client left (unprepared)."""
        wait(lambda: self.claims_gone(namespace), f"the claims and Clients of {namespace} removed")

    def apply(self, name: str, *manifests: dict[str, Any]) -> None:
        """``kubectl apply`` the manifests, written to ``<workdir>/<name>.yaml``."""
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump_all(manifests))
        self.node.kubectl("apply", "-f", str(path))

    def cdi_specs(self) -> list[Path]:
        return sorted(self.node.host_path("/run/cdi").glob("thundercompute.com-gpu_claim-*.json"))

    def upgrade(self, changes: dict[str, Any], timeout: str = "5m") -> str:
        """``helm upgrade --wait`` with the installed values and ``changes`` merged in."""
        self.values = merged(self.values, changes)
        path = self.workdir / "values.yaml"
        path.write_text(yaml.safe_dump(self.values))
        return self.helm(
            "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(path),
            "--wait", "--timeout", timeout,
        )  # fmt: skip

    def operator_pods(self) -> list[dict[str, Any]]:
        pods = self.get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=operator")
        return list((pods or {}).get("items", []))

    def clients(self, namespace: str) -> list[dict[str, Any]]:
        found = self.get("clients.thundercompute.com", "-n", namespace) or {}
        return list(found.get("items", []))

    def events(self, namespace: str, reason: str) -> list[dict[str, Any]]:
        found = self.get("events", "-n", namespace, "--field-selector", f"reason={reason}") or {}
        return list(found.get("items", []))

    def failed_prepares(
        self, namespace: str, since_log_line: int = 0, pods: Collection[str] | None = None
    ) -> list[str]:
        """The kubelet's FailedPrepareDynamicResources events of ``namespace``, and its
        log lines saying a prepare failed from line ``since_log_line`` on; only those of
        ``pods`` when given (the namespace's events outlive the earlier modules' pods)."""
        found = [
            f"event {e['involvedObject'].get('name')}: {e.get('message')}"
            for e in self.events(namespace, FAILED_PREPARE)
            if pods is None or e["involvedObject"].get("name") in pods
        ]
        lines = self.node.logs("kubelet").splitlines()[since_log_line:]
        wanted = [f'pod="{namespace}/{p}"' for p in pods] if pods is not None else None
        found += [
            ln
            for ln in lines
            if FAILED_PREPARE_LOG in ln
            and f'pod="{namespace}/' in ln
            and (wanted is None or any(w in ln for w in wanted))
        ]
        return found


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` merged in, maps recursively (neither is modified)."""
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def running(install: Install, name: str, namespace: str = "default") -> dict[str, Any] | None:
    """The pod, when its (first) container is running."""
    pod = install.get("pod", "-n", namespace, name) or {}
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return pod if statuses and "running" in (statuses[0].get("state") or {}) else None


def check_injected(install: Install, logs: str, gpus: int = 2) -> None:
    """A workload's own output (``INJECTED``) shows the driver's files and no credential."""
    assert "libthunder.so" in logs, logs
    assert "config.json" in logs
    assert "LD_PRELOAD=/etc/thunder/libthunder.so" in logs
    assert "config.json keys:" in logs
    # The served libthunder.so loaded into the workload's processes (the fake's constructor
    # says so on stderr) and read config.json at its mounted path; the loader refused none.
    preloaded = preloaded_lines(logs)
    assert preloaded, logs
    assert all("/etc/thunder/config.json read: " in line for line in preloaded), preloaded
    assert all("authToken" in line and "clientId" in line for line in preloaded), preloaded
    assert not loader_errors(logs), logs
    assert "THUNDER_GPU_TYPE=A6000" in logs
    assert f"THUNDER_GPU_COUNT={gpus}" in logs
    leaked = [s for s in install.secrets() if s in logs]
    assert not leaked, "a credential reached the workload's environment or output"


def _image_values(image: image_builder.BuiltImage) -> dict[str, str]:
    repository, tag = image.ref.rsplit(":", 1)
    return {"repository": repository, "tag": tag, "pullPolicy": "Never"}


def chart_values(fake: FakeThunderProcess, images: dict[str, image_builder.BuiltImage]) -> Any:
    trust = [{"name": "SSL_CERT_FILE", "value": SA_CA}]
    return {
        "thunder": {
            "apiURL": fake.base_url,
            "artifactBaseURL": fake.artifact_base_url,
            "telemetryURL": fake.base_url,
        },
        "operator": {
            "image": _image_values(images["operator"]),
            "reconcileInterval": "5s",
            "extraEnv": trust,
        },
        "daemon": {"image": _image_values(images["daemon"]), "extraEnv": trust},
        "test": {"image": _image_values(images["kubectl"])},
    }


def readme_install(readme: Path = README) -> list[list[str]]:
    """The commands of the README's Install section (Helm, from a clone), as argv lists:
    the first ``sh`` block after the ``## Install`` heading."""
    section = readme.read_text().split("\n## Install\n", 1)[1]
    found = re.search(r"```sh\n(.*?)```", section, re.S)
    if found is None:
        raise ValueError("README.md's Install section has no sh block")
    lines = found.group(1).replace("\\\n", " ").splitlines()
    commands = [shlex.split(line, comments=True) for line in lines]
    return [argv for argv in commands if argv]


def _run_readme_install(
    install: Install, token_file: Path, values: Path, helm_timeout: str = "5m", root: Path = REPO
) -> str:
    """Run the README's Install commands on the node's cluster, with ``token_file`` for the
    token and, on ``helm install``, the test's ``values`` and ``--wait``; the output of
    ``helm install``. Paths in the commands are those of the tree at ``root`` (this
    repository, or an earlier release's tree), and the README is that tree's: an earlier
    README's ``--from-literal=THUNDER_API_TOKEN='<token>'`` gets the token. On a node an
    earlier install used, the namespace is there already and its Secret is made anew."""
    node = install.node
    output = ""
    for argv in readme_install(root / "README.md"):
        tool = argv[0]
        args = [a.replace(TOKEN_FILE, str(token_file)).replace("<token>", API_TOKEN)
                for a in argv[1:]]  # fmt: skip
        args = [str(root / a) if not a.startswith("-") and (root / a).exists() else a
                for a in args]  # fmt: skip
        if tool == "kubectl":
            if args[:2] == ["create", "namespace"] and node.kubectl(
                "get", "namespace", args[2], "--ignore-not-found"
            ):
                node.kubectl("-n", args[2], "delete", "secret", "--all")
                continue
            node.kubectl(*args)
        elif tool == "helm":
            output = install.helm(*args, "-f", str(values), "--wait", "--timeout", helm_timeout)
        else:
            raise ValueError(f"README.md's Install section runs {tool}, not kubectl or helm")
    return output


def _forget_earlier_install(node: Node) -> None:
    """A node that served an earlier install (another fake Thunder) starts over: thunderd
    is not installed and the daemon's state directory is empty, as on a new server."""
    (FakeHost(node.fake_host_dir).root / THUNDER_FILE).unlink(missing_ok=True)
    state = node.host_path("/var/lib/thunder-dra")
    if state.is_dir():
        for entry in state.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


@contextmanager
def installed(
    node: Node,
    images: dict[str, image_builder.BuiltImage],
    workdir: Path,
    values: dict[str, Any] | None = None,
    tree: Path = REPO,
) -> Iterator[Install]:
    """The fake Thunder and the chart, installed as the README says; removed on exit.

    ``values`` are merged into the chart values. ``tree`` is the source tree whose README
    and chart are installed: this repository, or an earlier release's (the upgrade test).
    On a node an earlier install used, the daemon pods of that install are gone first and
    thunderd is installed anew."""
    cluster = node.cluster
    cert = cluster.server_certs[launcher.BRIDGE_CERT]
    _wait_no_daemon_pods(node)
    _forget_earlier_install(node)
    FakeHost(node.fake_host_dir).set_nvidia(gpus=["NVIDIA RTX A6000"] * 4, gpu_type="A6000")
    with start_fake_thunder(
        tokens=[API_TOKEN],
        listen=f"{launcher.BRIDGE_IP}:0",
        tls=(cert.cert, cert.key),
        ca_file=cluster.ca_cert,
        log_path=workdir / "fake-thunder.log",
    ) as fake:
        # The token from a file, as the README has it: never an argument on this
        # machine's process list.
        token_file = workdir / "token"
        token_file.touch(mode=0o600)
        token_file.write_text(API_TOKEN + "\n")
        chosen = merged(chart_values(fake, images), values or {})
        path = workdir / "values.yaml"
        path.write_text(yaml.safe_dump(chosen))
        install = Install(node, fake, images, "", workdir, chosen)
        install.install_output = _run_readme_install(install, token_file, path, root=tree)
        try:
            yield install
        finally:
            # As the chart's notes say: the ThunderCluster first, while the operator runs.
            node.kubectl("delete", "thunderclusters", "--all", "--timeout=60s", check=False)
            install.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", check=False)
            _wait_no_daemon_pods(node)


def _wait_no_daemon_pods(node: Node) -> None:
    def none_left() -> bool:
        out = node.kubectl(
            "get", "pods", "-A", "-l", "app.kubernetes.io/component=daemon", "-o", "name",
            check=False,
        )  # fmt: skip
        return not out.strip()

    wait(none_left, "the daemon pods of the uninstalled release gone", timeout=120)
