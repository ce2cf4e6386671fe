"""Simulated Nodes for the local control plane.

There is no kubelet: a Node object is created, given capacity and a Ready
condition, and the ``node.kubernetes.io/not-ready`` taint that admission adds
at creation is removed, because nothing else would remove it. The
node-lifecycle controller is not running, so the node stays Ready.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

ZONE_LABEL = "topology.kubernetes.io/zone"
SERVING_LABEL = "thundercompute.com/node"


def node_manifest(
    name: str, zone: str | None, serving: bool, labels: dict[str, str] | None
) -> dict[str, Any]:
    all_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
    if zone is not None:
        all_labels[ZONE_LABEL] = zone
    if serving:
        all_labels[SERVING_LABEL] = "true"
    all_labels.update(labels or {})
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": all_labels}}


def create_node(
    core: client.CoreV1Api,
    name: str,
    *,
    zone: str | None = None,
    serving: bool = False,
    labels: dict[str, str] | None = None,
    internal_ip: str = "127.0.0.1",
    external_ip: str | None = None,
) -> dict[str, Any]:
    """Create a Ready, schedulable node and return it as a dict."""
    body: Any = node_manifest(name, zone, serving, labels)
    core.create_node(body)
    addresses = [
        {"type": "InternalIP", "address": internal_ip},
        {"type": "Hostname", "address": name},
    ]
    if external_ip:
        addresses.append({"type": "ExternalIP", "address": external_ip})
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    status = {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "addresses": addresses,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "simulated node",
                }
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v1.37.2",
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "simulated://1",
                "kernelVersion": "",
                "osImage": "simulated",
                "machineID": name,
                "systemUUID": name,
                "bootID": name,
            },
        }
    }
    core.patch_node_status(name, status)
    node = core.read_node(name)
    spec = node.spec
    taints = [
        t
        for t in ((spec.taints if spec else None) or [])
        if t.key != "node.kubernetes.io/not-ready"
    ]
    core.patch_node(name, {"spec": {"taints": [t.to_dict() for t in taints] or None}})
    result: dict[str, Any] = core.api_client.sanitize_for_serialization(core.read_node(name))
    return result


def delete_node(core: client.CoreV1Api, name: str) -> None:
    try:
        core.delete_node(name)
    except client.ApiException as err:
        if err.status != 404:
            raise
