"""Waiting claims (and their pods) are told which tainted devices they cannot get."""

from __future__ import annotations

from typing import Any

from thunder_dra.controllers.inventory.notices import REASON, notices, tainted_classes
from thunder_dra.controllers.inventory.taints import TAINT_KEY, taint_body
from thunder_dra.controllers.shared.objects import MAX_PENDING, ClaimIndex, index_claim
from thunder_dra.kube import naming

DRIVER = naming.DRIVER_NAME
PREFIX = "thunder-gpu-"


def _device(name: str, label: str, zone: str, reason: str | None) -> dict[str, Any]:
    device: dict[str, Any] = {
        "name": name,
        "attributes": {
            naming.ATTRIBUTE_GPU_TYPE_LABEL: {"string": label},
            naming.ATTRIBUTE_ZONE: {"string": zone},
        },
    }
    if reason:
        device["taints"] = [taint_body(reason, "2026-12-02T00:00:00Z")]
    return device


def _slice(*devices: dict[str, Any], driver: str = DRIVER) -> dict[str, Any]:
    return {"spec": {"driver": driver, "pool": {"name": "p"}, "devices": list(devices)}}


def _claim(name: str, *classes: str, allocated: bool = False, pod: bool = True) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "metadata": {"namespace": "ml", "name": name, "uid": f"uid-{name}"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": classes[0]}},
                    {"name": "alt", "firstAvailable": [{"deviceClassName": c} for c in classes]},
                ]
            }
        },
    }
    if pod:
        claim["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": f"pod-{name}", "uid": f"pod-uid-{name}",
             "controller": True}
        ]  # fmt: skip
    if allocated:
        claim["status"] = {"allocation": {"devices": {"results": []}}}
    return claim


def _index(*claims: dict[str, Any]) -> ClaimIndex:
    index = ClaimIndex()
    for claim in claims:
        index_claim(index, claim, DRIVER)
    return index


def test_only_unallocated_live_claims_with_classes_are_pending() -> None:
    deleting = _claim("gone", "thunder-gpu-a6000")
    deleting["metadata"]["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    index = _index(
        _claim("waits", "thunder-gpu-a6000", "thunder-gpu-h100"),
        _claim("runs", "thunder-gpu-a6000", allocated=True),
        deleting,
        {"metadata": {"namespace": "ml", "name": "odd", "uid": "u"}, "spec": "not a mapping"},
    )
    assert [p.name for p in index.pending] == ["waits"]
    waits = index.pending[0]
    assert waits.classes == frozenset({"thunder-gpu-a6000", "thunder-gpu-h100"})
    assert waits.pod == ("pod-waits", "pod-uid-waits")


def test_the_pending_list_is_bounded() -> None:
    index = _index(*(_claim(f"c{i}", "thunder-gpu-a6000") for i in range(MAX_PENDING + 5)))
    assert len(index.pending) == MAX_PENDING


def test_tainted_classes_by_zone_and_reason_of_this_driver_only() -> None:
    slices = [
        _slice(
            _device("a6000-0", "a6000", "zone-a", "ThunderUnreachable"),
            _device("a6000-1", "a6000", "zone-b", None),
            _device("h100-0", "h100", "zone-a", "HostsOffline"),
        ),
        _slice(_device("x", "l4", "zone-a", "ThunderUnreachable"), driver="other.example.com"),
    ]
    assert tainted_classes(slices, DRIVER, PREFIX) == {
        "thunder-gpu-a6000": {"zone-a": {"ThunderUnreachable"}},
        "thunder-gpu-h100": {"zone-a": {"HostsOffline"}},
    }


def test_a_waiting_claim_and_its_pod_are_told_which_taint_keeps_them_waiting() -> None:
    tainted = {"thunder-gpu-a6000": {"zone-a": {"ThunderUnreachable"}}}
    index = _index(
        _claim("waits", "thunder-gpu-a6000"),
        _claim("other-model", "thunder-gpu-h100"),
        _claim("no-pod", "thunder-gpu-a6000", pod=False),
    )
    found = notices(index.pending, tainted)
    assert [(n.obj.kind, n.obj.name) for n in found] == [
        ("ResourceClaim", "waits"),
        ("Pod", "pod-waits"),
        ("ResourceClaim", "no-pod"),
    ]
    message = found[0].message
    assert f"{TAINT_KEY}:NoSchedule" in message
    assert "zone-a (ThunderUnreachable)" in message
    assert "thunder-gpu-a6000" in message
    assert found[1].obj.namespace == "ml"
    assert found[1].obj.uid == "pod-uid-waits"
    assert REASON == "ThunderDevicesTainted"


def test_no_taint_no_notice() -> None:
    assert notices(_index(_claim("waits", "thunder-gpu-a6000")).pending, {}) == []
