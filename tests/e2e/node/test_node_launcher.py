"""A real node (containerd, runc, CNI, kubelet) joins the local control plane and runs pods.

A pod from the stock Debian image runs on the node's bridge: its routing table
has the bridge subnet and the Service range and no default route, and it reaches the
apiserver through the ``kubernetes`` Service with its service-account token, as
in-cluster configuration does. ``kubectl logs`` reads its output through the kubelet.
Stopping the node removes every process, mount, cgroup, link and record it made and
restores the kernel settings the kubelet changed: the ``real_node`` fixture checks that
when the session ends (an error at teardown otherwise).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from hack import image as image_builder
from hack.node import launcher
from hack.node.launcher import Node
from tests.e2e.node.conftest import pod_logs, run_pod, stock_pod

# Reads the pod's own routes and calls GET /version on the apiserver with the
# service-account credentials the kubelet mounted.
ROUTES_AND_API = r"""
cat /proc/net/route
python3 - <<'EOF'
import json, os, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
ctx = ssl.create_default_context(cafile=f"{sa}/ca.crt")
token = open(f"{sa}/token").read()
req = urllib.request.Request(
    f"https://{host}:{port}/version", headers={"Authorization": f"Bearer {token}"}
)
with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
    print("API", host, json.load(resp)["gitVersion"])
EOF
"""

# The pod's neighbour table once it has talked to the apiserver: the bridge's hardware
# address, as the pod will use it for its next packets.
NEIGHBOURS = ROUTES_AND_API + "cat /proc/net/arp\n"


def _routes(text: str) -> list[tuple[str, str]]:
    """(destination, mask) of each route in /proc/net/route, as dotted quads."""

    def quad(hexword: str) -> str:
        return ".".join(str(b) for b in reversed(bytes.fromhex(hexword)))

    rows = [line.split() for line in text.splitlines() if line and not line.startswith("Iface")]
    return [(quad(r[1]), quad(r[7])) for r in rows if len(r) >= 8 and len(r[1]) == 8]


def test_node_is_ready_and_a_stock_pod_reaches_the_apiserver(
    real_node: Node, node_images: dict[str, image_builder.BuiltImage]
) -> None:
    node = json.loads(real_node.kubectl("get", "node", real_node.config.name, "-o", "json"))
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == launcher.BRIDGE_IP
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.37.2"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.4")

    pod = run_pod(real_node, stock_pod("plain", node_images["stock"].ref, ROUTES_AND_API))
    logs = pod_logs(real_node, "plain")
    assert pod["status"]["phase"] == "Succeeded", logs
    assert pod["status"]["podIP"].startswith("198.18.0.")
    routes = _routes(logs)
    assert ("0.0.0.0", "0.0.0.0") not in routes, logs
    assert ("198.18.0.0", "255.255.255.0") in routes
    assert ("198.18.1.0", "255.255.255.0") in routes
    assert f"API {launcher.API_SERVICE_IP} v1.37.2" in logs
    real_node.kubectl("delete", "pod", "plain", "--wait=true")


def _bridge() -> tuple[str, set[str]]:
    """The bridge's hardware address and the names of its ports."""
    sysfs = Path("/sys/class/net") / launcher.BRIDGE
    return (sysfs / "address").read_text().strip(), {p.name for p in (sysfs / "brif").iterdir()}


def test_the_bridge_keeps_its_hardware_address_as_pods_come_and_go(
    real_node: Node, node_images: dict[str, image_builder.BuiltImage]
) -> None:
    # A bridge takes the lowest address of its ports unless it was given one. A pod's
    # neighbour entry for the bridge would then name a port that left with its pod, and
    # the pod's packets to the apiserver would go nowhere until the entry expired.
    address, ports = _bridge()
    pod = run_pod(real_node, stock_pod("neighbours", node_images["stock"].ref, NEIGHBOURS))
    logs = pod_logs(real_node, "neighbours")
    assert pod["status"]["phase"] == "Succeeded", logs
    rows = [ln.split() for ln in logs.splitlines() if ln.startswith("198.18.")]
    assert rows, logs
    assert {r[3] for r in rows} == {address}, logs
    real_node.kubectl("delete", "pod", "neighbours", "--wait=true")
    deadline = time.monotonic() + 60
    while _bridge()[1] != ports and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _bridge() == (address, ports)
