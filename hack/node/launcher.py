"""Run a real node on this machine: containerd (CDI on), runc, CNI and a kubelet.

The node joins a local control plane (``hack.cluster.Cluster`` started with
``node_cluster_config()``). All its state lives under one temporary directory: the
kubelet's root, certificate, pod-log and volume-plugin directories, containerd's
root, state, sockets and snapshots, runc's state, the CNI configuration and IPAM
data, and the node's own CDI spec directory.

Networking stays on this machine. Pods get addresses on a bridge of their own
(``thdra0``, 198.18.0.0/24, a benchmarking range) with a route to that subnet and to
the Service range only: no default route, no masquerading, no iptables rules, and
``net.ipv4.ip_forward`` left as it is. The bridge has a fixed hardware address
(``BRIDGE_MAC``), so the pods' neighbour entries for it stay true as pods come and go.
The ``kubernetes`` Service address (198.18.1.1) sits on the bridge and a ``socat``
relay forwards it to the apiserver on loopback, so in-cluster configuration works. The
apiserver calls webhooks at their endpoint IPs (``--enable-aggregator-routing``), which
are on the bridge.

containerd and the kubelet (so every pod) run in a private PID and mount namespace
whose PID 1 is ``hack/node/nsinit.py`` (``NodeConfig.sandbox``): a hostPID pod's
``nsenter --target 1`` enters it, where the fake host tools shadow the host's and the
host paths the chart's daemon writes are tmpfs or the node's own directories.

The kubelet changes some kernel settings at start (``vm.overcommit_memory``,
``kernel.panic`` ...): they are recorded first and restored on stop. A record of
every running node (``/run/thunder-dra-node/<pid>.json``) lets the next start clean
up after a node whose launcher died: processes, mounts, cgroups, links, sysctls and
the directories it created outside its temporary directory.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hack import supervise
from hack.cluster.launcher import Cluster, ClusterConfig, free_port
from hack.tied import start_tied

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "hack" / "build-node-tools.sh"

BRIDGE = "thdra0"
# A locally administered address of the bridge's own. A bridge given none takes the lowest
# address of its ports: it changes as pods come and go, and a pod that learnt the old one
# sends its packets to the apiserver to a port that is gone until its neighbour entry
# expires (tens of seconds).
BRIDGE_MAC = "02:74:68:64:72:61"
POD_SUBNET = "198.18.0.0/24"
BRIDGE_IP = "198.18.0.1"
SERVICE_CIDR = "198.18.1.0/24"
API_SERVICE_IP = "198.18.1.1"
CGROUP_ROOT = "thunder-dra-node"
RECORDS = Path("/run/thunder-dra-node")
NODE_NAME = "thunder-node-0"
# A serving certificate from the cluster CA for the bridge address (Cluster.server_certs):
# pods trust it through their service-account ca.crt, e.g. for a fake Thunder over https.
BRIDGE_CERT = "bridge-server"
NSINIT = Path(__file__).resolve().parent / "nsinit.py"
FAKE_HOST_TOOLS = ("thunder", "nvidia-smi", "thunder-fake-installer")
# Inside the node's mount namespace: host paths the kubelet, containerd, CNI and the
# chart's daemon (hostPath volumes) write get a tmpfs of their own.
SANDBOX_TMPFS = (
    "/run/cdi",
    "/run/containerd",
    "/var/lib/thunder-dra",
    "/var/lib/cni",
    "/var/log/containers",
    "/var/log/pods",
)
# ... and these show the node's own directories: the kubelet's root, where the chart's
# default kubelet paths point, and the fake host tools first on the host's PATH.
SANDBOX_KUBELET_ROOT = "/var/lib/kubelet"
SANDBOX_HOST_BIN = "/usr/local/sbin"
# The node-lifecycle controller clears the not-ready taint; the endpoints controllers
# give Services of real pods (the chart's webhook) endpoints the apiserver can call; the
# job controller runs the chart's pre-delete hook, a Job.
CONTROLLERS = (
    "node-lifecycle-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "job-controller",
)
CNI_BIN = Path("/usr/lib/cni")
CGROUP_FS = Path("/sys/fs/cgroup")
# Kernel settings the kubelet sets at start (pkg/kubelet/cm setupKernelTunables).
SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# Written by the kubelet, containerd, CNI or the daemon outside the node's directory:
# removed on stop when they did not exist before the node started.
OUTSIDE_PATHS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
    "/run/containerd",
    "/run/cdi",
    "/var/lib/thunder-dra",
)


# One real node per machine (the bridge, its addresses and the cgroup root are fixed):
# a second launcher waits for the first to stop, instead of tearing its network down.
MACHINE_LOCK = RECORDS.parent / "thunder-dra-node.lock"
_lock_depth = 0
_lock_file: Any = None


@contextlib.contextmanager
def one_node_at_a_time() -> Iterator[None]:
    """Hold the machine's node lock (re-entrant within a process) while the body runs.

    Waits while another process runs a node. Callers that check for leftovers after a
    node stopped hold it around the check too, so no other node can start in between.
    """
    global _lock_depth, _lock_file
    if _lock_depth == 0:
        handle = open(MACHINE_LOCK, "a")  # noqa: SIM115 - held across the body
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"another real node runs on this machine ({MACHINE_LOCK}): waiting", flush=True)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        _lock_file = handle
    _lock_depth += 1
    try:
        yield
    finally:
        _lock_depth -= 1
        if _lock_depth == 0:
            _lock_file.close()
            _lock_file = None


class NodeError(RuntimeError):
    """The node could not be built, started, reached or cleaned up."""


@dataclass(frozen=True)
class NodeTools:
    kubelet: Path
    containerd_bin: Path
    pause: Path
    pause_ref: str

    @property
    def missing(self) -> list[Path]:
        wanted = [
            self.kubelet,
            self.containerd_bin / "containerd",
            self.containerd_bin / "containerd-shim-runc-v2",
            self.containerd_bin / "ctr",
            self.pause,
        ]
        return [p for p in wanted if not p.exists()]


def node_tools(build: bool = False) -> NodeTools:
    """The cached node components; with ``build``, build or install what is missing."""
    argv = ["bash", str(BUILD_SCRIPT)] + ([] if build else ["--print"])
    proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise NodeError(f"{BUILD_SCRIPT} failed with exit code {proc.returncode}")
    paths = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return NodeTools(
        kubelet=Path(paths["kubelet"]),
        containerd_bin=Path(paths["containerd"]),
        pause=Path(paths["pause"]),
        pause_ref=paths["pause_ref"],
    )


def require_cgroup_v1(root: Path | None = None) -> None:
    """Refuse a host with only cgroup v2: the node's kubelet runs with the cgroupfs driver
    under a cgroup root made in each v1 hierarchy (`Node._cgroups`), which such a host
    lacks. That is the host to change, not a reason to skip quietly, so it raises."""
    root = root or CGROUP_FS
    if (root / "cgroup.controllers").is_file() and not (root / "memory").is_dir():
        raise NodeError(
            f"this host has only cgroup v2 (the unified hierarchy is mounted at {root} and "
            f"there is no v1 memory hierarchy at {root / 'memory'}); a real node needs "
            "cgroup v1 hierarchies: boot the host with cgroup v1 (kernel command line "
            "systemd.unified_cgroup_hierarchy=0) or run the real-node tests on a cgroup v1 host"
        )


def node_unavailable(tools: NodeTools | None = None) -> str | None:
    """Why a real node cannot run here, or None when it can; raises `NodeError` on a
    host that can never run one as it is (only cgroup v2)."""
    if os.geteuid() != 0:
        return "a real node needs root (mounts, cgroups, network links)"
    require_cgroup_v1()
    for binary, package in (
        ("runc", "runc"),
        ("socat", "socat"),
        ("ip", "iproute2"),
        ("umoci", "umoci"),
    ):
        if shutil.which(binary) is None:
            return f"{binary} is missing (Debian package {package}; hack/build-node-tools.sh)"
    if not (CNI_BIN / "bridge").exists() or not (CNI_BIN / "host-local").exists():
        return "the CNI plugins are missing (Debian package containernetworking-plugins)"
    if not (CGROUP_FS / "memory").is_dir():
        return f"no cgroup v1 memory hierarchy at {CGROUP_FS / 'memory'}"
    if not Path("/sys/class/net").is_dir():
        return "no /sys/class/net"
    tools = tools or node_tools()
    if tools.missing:
        return (
            "the node components are not built yet "
            f"({', '.join(str(p) for p in tools.missing)}; run hack/build-node-tools.sh)"
        )
    return None


def node_cluster_config(**overrides: Any) -> ClusterConfig:
    """A control-plane configuration a real node can join."""
    return ClusterConfig(
        service_cidr=SERVICE_CIDR,
        apiserver_ips=(API_SERVICE_IP, BRIDGE_IP),
        aggregator_routing=True,
        nodes=(NODE_NAME,),
        extra_controllers=CONTROLLERS,
        server_certs=((BRIDGE_CERT, (BRIDGE_IP,)),),
        **overrides,
    )


@dataclass
class NodeConfig:
    name: str = NODE_NAME
    # More CDI spec directories for containerd (the node's own one is always there).
    cdi_dirs: tuple[str, ...] = ()
    # OCI archives to import into containerd's k8s.io namespace before the kubelet starts.
    images: tuple[Path, ...] = ()
    ready_timeout: float = 120.0
    log_level: int = 2
    # Run containerd and the kubelet (and so every pod) in a private PID and mount
    # namespace whose PID 1 is hack/node/nsinit.py: a hostPID pod's `nsenter --target 1`
    # enters it, where the fake host tools shadow the host's and the host paths the
    # daemon writes (/run/cdi, /var/lib/thunder-dra, /var/lib/kubelet) are the node's.
    sandbox: bool = True
    # Labels the kubelet registers the Node with (e.g. the zone and the serving role).
    node_labels: dict[str, str] = field(default_factory=dict)
    # More environment for the fake host tools (e.g. SSL_CERT_FILE for an https fake).
    host_env: dict[str, str] = field(default_factory=dict)


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    # The process itself when popen is the nsenter that started it in the node's
    # namespaces (nsenter forwards no signal), else popen's.
    target: int = 0


def _run(argv: list[str], *, check: bool = True, timeout: float = 120) -> str:
    proc = subprocess.run(
        argv, capture_output=True, text=True, check=False, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if check and proc.returncode != 0:
        raise NodeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _child_of(pid: int, timeout: float = 10.0) -> int:
    """The (first) child of ``pid``: what an ``nsenter`` or ``unshare --fork`` started."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            found = children.read_text().split()
            if found:
                return int(found[0])
        time.sleep(0.02)
    raise NodeError(f"process {pid} started no child within {timeout:.0f}s")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Node:
    """One real node for one control plane. Use as a context manager."""

    def __init__(
        self,
        cluster: Cluster,
        config: NodeConfig | None = None,
        tools: NodeTools | None = None,
        workdir: Path | None = None,
    ) -> None:
        self.cluster = cluster
        self.config = config or NodeConfig()
        self.tools = tools or node_tools()
        if self.config.name not in cluster.node_kubeconfigs:
            raise NodeError(
                f"node {self.config.name!r} has no kubeconfig: start the cluster with "
                "hack.node.node_cluster_config() (ClusterConfig.nodes)"
            )
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="thunder-dra-node-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.containerd_socket = self.workdir / "containerd" / "containerd.sock"
        self.cdi_dir = self.workdir / "cdi"
        self.kubelet_root = self.workdir / "kubelet"
        # The fake host tools' state (hack.fake_host.FakeHost) and their wrappers, which
        # the sandbox shows at /usr/local/sbin.
        self.fake_host_dir = self.workdir / "fake-host"
        self.host_bin = self.workdir / "host-sbin"
        self.init_pid = 0
        self.started_at = 0.0
        self.ready_after = 0.0
        self._procs: list[_Proc] = []
        self._record_path = RECORDS / f"{os.getpid()}-{self.workdir.name}.json"
        self._record: dict[str, Any] = {}
        self._lock: contextlib.ExitStack | None = None

    # -- lifecycle -----------------------------------------------------------------
    def __enter__(self) -> Node:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        why = node_unavailable(self.tools)
        if why:
            raise NodeError(why)
        self._lock = contextlib.ExitStack()
        self._lock.enter_context(one_node_at_a_time())
        cleanup_leftovers()
        self.started_at = time.monotonic()
        try:
            self._write_record()
            self._network()
            self._relay()
            if self.config.sandbox:
                self._start_sandbox()
            self._start_containerd()
            self._import_images()
            self._start_kubelet()
            self._wait_ready()
            self.ready_after = time.monotonic() - self.started_at
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for proc in reversed(self._procs):
            supervise.terminate(proc.popen, proc.target or None)
        for proc in reversed(self._procs):
            supervise.reap(proc.popen, 15, proc.target or None)
        if self._record:
            teardown(self._record)
        self._procs.clear()
        self._record = {}
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def restart_runtime(self, between: Any = None) -> None:
        """Stop the kubelet and containerd (a reboot of the node's runtime), then start them."""
        for name in ("kubelet", "containerd"):
            self._stop_proc(name)
        keep = {os.getpid(), *(p.popen.pid for p in self._procs), *(p.target for p in self._procs)}
        _kill_matching(str(self.containerd_socket), exclude=keep)
        if between is not None:
            between()
        self._start_containerd()
        self._start_kubelet()
        self._wait_ready()

    def host_path(self, path: str | Path) -> Path:
        """Where a path of the node's mount namespace is visible from this machine."""
        if not self.config.sandbox or not self.init_pid:
            return Path(path)
        return Path(f"/proc/{self.init_pid}/root") / Path(path).relative_to("/")

    # -- steps ---------------------------------------------------------------------
    def _fake_host_tools(self) -> None:
        self.fake_host_dir.mkdir(exist_ok=True)
        self.host_bin.mkdir(exist_ok=True)
        env = {"THUNDER_FAKE_HOST": str(self.fake_host_dir), **self.config.host_env}
        exports = "".join(f"export {k}='{v}'\n" for k, v in sorted(env.items()))
        for tool in FAKE_HOST_TOOLS:
            wrapper = self.host_bin / tool
            wrapper.write_text(
                "#!/bin/sh\n# Fake host tool of a real test node (hack/fake_host).\n"
                f"{exports}exec /usr/bin/python3 {REPO / 'hack' / 'fake_host' / 'bin' / tool} "
                '"$@"\n'
            )
            wrapper.chmod(0o755)

    def _start_sandbox(self) -> None:
        """PID 1 of the node's private PID and mount namespaces, with its mounts made."""
        self._fake_host_tools()
        self.kubelet_root.mkdir(exist_ok=True)
        for target in (*SANDBOX_TMPFS, SANDBOX_KUBELET_ROOT):
            Path(target).mkdir(parents=True, exist_ok=True)
        mounts: list[dict[str, Any]] = [{"target": t, "tmpfs": True} for t in SANDBOX_TMPFS]
        mounts += [
            {"target": SANDBOX_KUBELET_ROOT, "source": str(self.kubelet_root)},
            {"target": SANDBOX_HOST_BIN, "source": str(self.host_bin)},
        ]
        ready = self.workdir / "nsinit.ready"
        self._spawn(
            "nsinit",
            [
                "unshare",
                "--pid",
                "--mount",
                "--fork",
                "--mount-proc",
                "--propagation",
                "private",
                shutil.which("python3") or "/usr/bin/python3",
                str(NSINIT),
                str(ready),
                json.dumps(mounts),
            ],
        )
        unshare = self._procs[-1]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self._check_alive()
            if ready.exists():
                self.init_pid = unshare.target = _child_of(unshare.popen.pid)
                self._record["init_pid"] = self.init_pid
                Path(self._record["record"]).write_text(json.dumps(self._record))
                return
            time.sleep(0.05)
        raise NodeError(f"the node's namespace init did not start\n{self.log_tail('nsinit')}")

    def _write_record(self) -> None:
        RECORDS.mkdir(parents=True, exist_ok=True)
        sysctls = {}
        for name in SYSCTLS:
            path = Path("/proc/sys") / name
            with contextlib.suppress(OSError):
                sysctls[name] = path.read_text().strip()
        self._record = {
            "pid": os.getpid(),
            "workdir": str(self.workdir),
            "sysctls": sysctls,
            "created": [p for p in OUTSIDE_PATHS if not os.path.lexists(p)],
        }
        self._record_path.write_text(json.dumps(self._record))
        self._record["record"] = str(self._record_path)
        self._record_path.write_text(json.dumps(self._record))

    def _network(self) -> None:
        _run(["ip", "link", "add", BRIDGE, "address", BRIDGE_MAC, "type", "bridge"])
        _run(["ip", "addr", "add", f"{BRIDGE_IP}/24", "dev", BRIDGE])
        _run(["ip", "addr", "add", f"{API_SERVICE_IP}/32", "dev", BRIDGE])
        _run(["ip", "link", "set", BRIDGE, "up"])
        cni = self.workdir / "cni"
        (cni / "net.d").mkdir(parents=True)
        conf = {
            "cniVersion": "1.0.0",
            "name": "thunder-dra-node",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    # Neither: no iptables rules, ip_forward untouched, no bridge address
                    # from the plugin (the launcher gave it one).
                    "isGateway": False,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [
                            [
                                {
                                    "subnet": POD_SUBNET,
                                    "rangeStart": "198.18.0.10",
                                    "rangeEnd": "198.18.0.250",
                                    "gateway": BRIDGE_IP,
                                }
                            ]
                        ],
                        # Only the Service range; the subnet itself is a link route.
                        "routes": [{"dst": SERVICE_CIDR, "gw": BRIDGE_IP}],
                        "dataDir": str(cni / "ipam"),
                    },
                }
            ],
        }
        (cni / "net.d" / "10-thunder-dra.conflist").write_text(json.dumps(conf, indent=2))
        # Nothing answers DNS inside a pod's network namespace; lookups fail at once.
        (self.workdir / "resolv.conf").write_text(
            "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
        )

    def _relay(self) -> None:
        api_port = self.cluster.server.rsplit(":", 1)[1]
        self._spawn(
            "socat",
            [
                "socat",
                f"TCP-LISTEN:443,bind={API_SERVICE_IP},reuseaddr,fork",
                f"TCP:127.0.0.1:{api_port}",
            ],
        )

    def _containerd_config(self) -> Path:
        w = self.workdir / "containerd"
        w.mkdir(exist_ok=True)
        self.cdi_dir.mkdir(exist_ok=True)
        cdi_dirs = [str(self.cdi_dir), *self.config.cdi_dirs]
        if self.config.sandbox:
            # The chart's daemon writes claim specs to the host's /var/run/cdi.
            cdi_dirs.insert(0, "/run/cdi")
        runtime = "io.containerd.cri.v1.runtime"
        config = f"""version = 3
root = "{w / "root"}"
state = "{w / "state"}"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{self.containerd_socket}.ttrpc"
[debug]
  address = "{w / "debug.sock"}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{w / "opt"}"
[plugins."io.containerd.snapshotter.v1.overlayfs"]
  root_path = "{w / "overlayfs"}"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{self.tools.pause_ref}"
[plugins."{runtime}"]
  cdi_spec_dirs = {json.dumps(cdi_dirs)}
  # No CAP_SYS_RESOURCE on this kind of VM: never ask runc to lower an OOM score.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  disable_apparmor = true
  [plugins."{runtime}".containerd]
    default_runtime_name = "runc"
    [plugins."{runtime}".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."{runtime}".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{shutil.which("runc")}"
        Root = "{self.workdir / "runc"}"
  [plugins."{runtime}".cni]
    bin_dirs = ["{CNI_BIN}"]
    conf_dir = "{self.workdir / "cni" / "net.d"}"
    max_conf_num = 1
    use_internal_loopback = true
"""
        path = w / "config.toml"
        path.write_text(config)
        return path

    def _start_containerd(self) -> None:
        config = self._containerd_config()
        env = {"PATH": f"{self.tools.containerd_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
        self._spawn(
            "containerd",
            [str(self.tools.containerd_bin / "containerd"), "--config", str(config)],
            env=env,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self._check_alive()
            out = subprocess.run(
                [*self.ctr(), "version"], capture_output=True, text=True, check=False
            )
            if out.returncode == 0:
                return
            time.sleep(0.2)
        raise NodeError(f"containerd did not answer on {self.containerd_socket} within 60s")

    def ctr(self) -> list[str]:
        """The ``ctr`` command line for this node's containerd, k8s.io namespace."""
        return [
            str(self.tools.containerd_bin / "ctr"),
            "--address",
            str(self.containerd_socket),
            "--namespace",
            "k8s.io",
        ]

    def import_image(self, archive: Path, base_name: str | None = None) -> None:
        argv = [*self.ctr(), "images", "import", "--snapshotter", "overlayfs"]
        if base_name:
            argv += ["--base-name", base_name]
        _run([*argv, str(archive)], timeout=600)

    def tag_image(self, ref: str, new_ref: str) -> None:
        """Give an imported image a second name (e.g. a new tag of the same image)."""
        _run([*self.ctr(), "images", "tag", "--force", ref, new_ref])

    def kill_container(self, container_id: str, signum: str = "SIGKILL") -> None:
        """Signal a container's main process (a CRI ID, ``containerd://`` prefix or not)."""
        cid = container_id.removeprefix("containerd://")
        _run([*self.ctr(), "tasks", "kill", "--signal", signum, cid])

    def _import_images(self) -> None:
        self.import_image(self.tools.pause, base_name=self.tools.pause_ref.rsplit(":", 1)[0])
        for archive in self.config.images:
            self.import_image(archive)

    def _kubelet_config(self) -> Path:
        root = self.kubelet_root
        root.mkdir(exist_ok=True)
        self._healthz_port = free_port()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{CGROUP_ROOT}",
            "cgroupsPerQOS": True,
            "enforceNodeAllocatable": ["pods"],
            "failSwapOn": False,
            "makeIPTablesUtilChains": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "resolvConf": str(self.workdir / "resolv.conf"),
            "address": BRIDGE_IP,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self._healthz_port,
            "authentication": {
                # The kubelet port is reachable from pods on the bridge.
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.cluster.ca_cert)},
            },
            "authorization": {"mode": "Webhook"},
            "podLogsDir": str(self.workdir / "pod-logs"),
            "volumePluginDir": str(self.workdir / "volume-plugins"),
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            # The imported images are never pulled again: never garbage-collect them.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "registerNode": True,
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            "maxPods": 40,
            "hairpinMode": "none",
            "protectKernelDefaults": False,
            "localStorageCapacityIsolation": True,
            "kernelMemcgNotification": False,
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "shutdownGracePeriod": "0s",
        }
        path = root / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def _cgroups(self) -> None:
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            if not hierarchy.is_dir() or hierarchy.is_symlink():
                continue
            target = hierarchy / CGROUP_ROOT
            target.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":
                for key in ("cpuset.cpus", "cpuset.mems"):
                    (target / key).write_text((hierarchy / key).read_text())

    def _start_kubelet(self) -> None:
        self._cgroups()
        config = self._kubelet_config()
        root = Path(SANDBOX_KUBELET_ROOT) if self.config.sandbox else self.kubelet_root
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.config.node_labels.items()))
        self._spawn(
            "kubelet",
            [
                str(self.tools.kubelet),
                f"--config={config}",
                f"--kubeconfig={self.cluster.node_kubeconfigs[self.config.name]}",
                f"--root-dir={root}",
                f"--cert-dir={root / 'pki'}",
                f"--hostname-override={self.config.name}",
                f"--node-ip={BRIDGE_IP}",
                f"--v={self.config.log_level}",
                *([f"--node-labels={labels}"] if labels else []),
            ],
        )

    def kubectl(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        return _run(
            [
                str(self.cluster.bin_dir / "kubectl"),
                f"--kubeconfig={self.cluster.kubeconfig}",
                *args,
            ],
            check=check,
            timeout=timeout,
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.config.ready_timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            out = self.kubectl("get", "node", self.config.name, "-o", "json", check=False)
            if out:
                node = json.loads(out)
                conditions = {c["type"]: c for c in node.get("status", {}).get("conditions", [])}
                ready = conditions.get("Ready", {})
                taints = [t["key"] for t in node.get("spec", {}).get("taints", []) or []]
                last = f"Ready={ready.get('status')} ({ready.get('message', '')}), taints {taints}"
                if ready.get("status") == "True" and not any(
                    t.startswith("node.kubernetes.io/") for t in taints
                ):
                    return
            time.sleep(0.5)
        raise NodeError(
            f"node {self.config.name} not Ready after {self.config.ready_timeout:.0f}s: {last}\n"
            + self.log_tail("kubelet")
        )

    # -- helpers -------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = self.workdir / f"{name}.log"
        inside = self.config.sandbox and self.init_pid and name in ("containerd", "kubelet")
        if inside:
            argv = ["nsenter", f"--target={self.init_pid}", "--pid", "--mount", "--", *argv]
        with log.open("ab") as out:
            # SIGTERM when this run ends, so the node's processes stop cleanly.
            popen = start_tied(
                argv,
                signal="TERM",
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **(env or {})},
            )
        proc = _Proc(name, popen, log)
        self._procs.append(proc)
        if inside:
            proc.target = _child_of(popen.pid)

    def _stop_proc(self, name: str) -> None:
        for proc in list(self._procs):
            if proc.name != name:
                continue
            supervise.stop(proc.popen, 15, proc.target or None)
            self._procs.remove(proc)

    def _check_alive(self) -> None:
        for proc in self._procs:
            code = proc.popen.poll()
            if code is not None:
                raise NodeError(f"{proc.name} exited with code {code}\n{self.log_tail(proc.name)}")

    def log_tail(self, name: str, lines: int = 30) -> str:
        return supervise.log_tail(self.workdir / f"{name}.log", lines)

    def logs(self, name: str) -> str:
        return supervise.read_log(self.workdir / f"{name}.log")


# -- teardown ------------------------------------------------------------------------
def _processes() -> Iterator[tuple[int, str]]:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            yield int(entry.name), cmdline


def _cgroup_dirs() -> list[Path]:
    """Every cgroup directory under the node's root, deepest first."""
    found: list[Path] = []
    base = Path("/sys/fs/cgroup")
    if not base.is_dir():
        return found
    for hierarchy in base.iterdir():
        root = hierarchy / CGROUP_ROOT
        if root.is_dir() and not hierarchy.is_symlink():
            found += [Path(d) for d, _, _ in os.walk(root)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _cgroup_pids() -> set[int]:
    pids: set[int] = set()
    for d in _cgroup_dirs():
        with contextlib.suppress(OSError):
            pids |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
    return pids


def _kill_matching(needle: str, exclude: set[int]) -> None:
    """SIGKILL every process whose command line names ``needle`` (shims, containerd, kubelet)."""
    for _ in range(50):
        victims = {pid for pid, cmd in _processes() if needle in cmd} - exclude
        if not victims:
            return
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _kill_cgroup_members(exclude: set[int]) -> None:
    for _ in range(50):
        victims = _cgroup_pids() - exclude
        if not victims:
            return
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def _mounts_under(prefixes: tuple[str, ...]) -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == p or point.startswith(p.rstrip("/") + "/") for p in prefixes):
            points.append(point)
    return points


def _unmount_all(prefixes: tuple[str, ...]) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    for _ in range(20):
        points = _mounts_under(prefixes)
        if not points:
            return
        for point in sorted(points, key=lambda p: p.count("/"), reverse=True):
            libc.umount2(point.encode(), 2)  # MNT_DETACH
    leftover = _mounts_under(prefixes)
    if leftover:
        raise NodeError(f"could not unmount {leftover[:5]}")


def _remove_links() -> None:
    if not Path(f"/sys/class/net/{BRIDGE}").exists():
        return
    for port in Path(f"/sys/class/net/{BRIDGE}/brif").iterdir():
        subprocess.run(["ip", "link", "delete", port.name], capture_output=True, check=False)
    subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)


def teardown(record: dict[str, Any]) -> None:
    """Remove everything a node made, from its record (also after its launcher died)."""
    workdir = record["workdir"]
    me = {os.getpid()}
    _kill_matching(workdir, exclude=me)
    _kill_cgroup_members(exclude=me)
    created = tuple(record.get("created", []))
    _unmount_all((workdir, *(p for p in ("/run/containerd", "/var/lib/kubelet") if p in created)))
    for d in _cgroup_dirs():
        with contextlib.suppress(OSError):
            d.rmdir()
    _remove_links()
    for name, value in record.get("sysctls", {}).items():
        with contextlib.suppress(OSError):
            (Path("/proc/sys") / name).write_text(value)
    for path in record.get("created", []):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)
    shutil.rmtree(workdir, ignore_errors=True)
    record_file = record.get("record")
    if record_file:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(record_file)


def cleanup_leftovers() -> list[str]:
    """Tear down nodes whose launcher is gone; returns the work directories cleaned."""
    cleaned: list[str] = []
    if not RECORDS.is_dir():
        return cleaned
    for path in sorted(RECORDS.glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
            continue
        if _pid_alive(int(record.get("pid", 0))) and record["pid"] != os.getpid():
            continue
        record["record"] = str(path)
        teardown(record)
        cleaned.append(record["workdir"])
    return cleaned


def leftovers() -> list[str]:
    """What a stopped node would have left behind: for tests of the teardown."""
    found: list[str] = []
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        found.append(f"link {BRIDGE}")
    found += [f"cgroup {d}" for d in _cgroup_dirs()]
    found += [
        f"mount {line.split()[4]}"
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if "thunder-dra-node-" in line.split()[4]
    ]
    found += [
        f"process {pid} {cmd[:80]}"
        for pid, cmd in _processes()
        if "thunder-dra-node-" in cmd and "pytest" not in cmd and pid != os.getpid()
    ]
    if RECORDS.is_dir():
        found += [f"record {p}" for p in RECORDS.glob("*.json")]
    return found
