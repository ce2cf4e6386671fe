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
