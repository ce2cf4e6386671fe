"""Desired ResourceSlices: splitting, stable device indices, node selection, metadata."""

from __future__ import annotations

import json
import math
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thunder_dra.api import ThunderClusterSpec, syntax
from thunder_dra.controllers.inventory.capacity import PoolCapacity, TargetSource
from thunder_dra.controllers.inventory.slices import (
    InventoryConfig,
    build_pools,
    published_devices,
    split_devices,
    stable_device_names,
)
from thunder_dra.kube import naming

EXAMPLES = settings(max_examples=100, deadline=None)
CONFIG = InventoryConfig()


def capacity(
    zone: str = "us-east", model: str = "A6000", published: int = 4, target: str = "1"
) -> PoolCapacity:
    return PoolCapacity(
        zone_name=zone,
        model=model,
        physical=published,
        target=Decimal(target),
        target_source=TargetSource.UNSET,
        live_client_gpus=0,
        published=published,
        zone_ids=("z1",),
    )


@pytest.mark.parametrize(("count", "sizes"), [(2000, [64] * 31 + [16]), (200, [64, 64, 64, 8])])
def test_large_pools_split_into_full_slices(count: int, sizes: list[int]) -> None:
    [pool] = build_pools([capacity(published=count)], CONFIG).pools
    manifests = pool.manifests(generation=1)
    assert [len(m["spec"]["devices"]) for m in manifests] == sizes
    assert {m["spec"]["pool"]["resourceSliceCount"] for m in manifests} == {len(sizes)}
    names = [d["name"] for m in manifests for d in m["spec"]["devices"]]
    assert names == [f"a6000-{i}" for i in range(count)]
    assert len({m["metadata"]["name"] for m in manifests}) == len(sizes)


@EXAMPLES
@given(st.integers(min_value=0, max_value=1500), st.sampled_from([64, 128]))
def test_splitting_places_every_device_exactly_once(count: int, per_slice: int) -> None:
    devices = tuple(f"d-{i}" for i in range(count))
    chunks = split_devices(devices, per_slice)
    assert [d for chunk in chunks for d in chunk] == list(devices)
    assert all(0 < len(chunk) <= per_slice for chunk in chunks)
    assert len(chunks) == math.ceil(count / per_slice)


current_sets = st.sets(st.integers(min_value=0, max_value=300), max_size=60)


@EXAMPLES
@given(current_sets, st.integers(min_value=0, max_value=200), st.data())
def test_device_indices_are_stable(current: set[int], count: int, data: st.DataObject) -> None:
    allocated = data.draw(st.sets(st.sampled_from(sorted(current))) if current else st.just(set()))
    names = {naming.device_name("a6000", i) for i in current}
    taken = {naming.device_name("a6000", i) for i in allocated}
    result = stable_device_names("a6000", count, names, taken)
    chosen = {i for n in result if (i := naming.device_index("a6000", n)) is not None}
    assert len(result) == len(chosen) == max(count, len(allocated))
    assert allocated <= chosen
    if count >= len(current):
        # Growing keeps every device and fills the lowest free indices.
        assert current <= chosen
        added = sorted(chosen - current)
        free = [i for i in range(max(chosen, default=0) + 1) if i not in current]
        assert added == free[: len(added)]
    else:
        # Shrinking only removes, and removes the highest devices that are free.
        assert chosen <= current
        removed = current - chosen
        kept_free = current - allocated - removed
        assert all(r > k for r in removed for k in kept_free)
    assert stable_device_names("a6000", count, names, taken) == result
    assert stable_device_names("a6000", len(result), set(result), taken) == result


def test_shrinking_keeps_an_allocated_high_index() -> None:
    current = [naming.device_name("a6000", i) for i in range(10)]
    result = stable_device_names("a6000", 5, current, ["a6000-9"])
    assert result == ("a6000-0", "a6000-1", "a6000-2", "a6000-3", "a6000-9")
    grown = stable_device_names("a6000", 7, result, ())
    assert grown == (*result[:4], "a6000-4", "a6000-5", "a6000-9")


def test_a_slice_manifest() -> None:
    [pool] = build_pools([capacity(zone="us-east-1", model="A6000", target="1.5")], CONFIG).pools
    [manifest] = pool.manifests(generation=3)
    assert manifest["apiVersion"] == "resource.k8s.io/v1"
    assert manifest["metadata"]["name"] == "thunder.us-east-1.a6000.0"
    assert manifest["metadata"]["labels"] == {
        "app.kubernetes.io/name": "thunder-dra-driver",
        "app.kubernetes.io/component": "resource-inventory",
        "thundercompute.com/oversubscription": "1.5",
        "thundercompute.com/gpu-type": "a6000",
        "thundercompute.com/zone": "us-east-1",
    }
    assert manifest["metadata"]["annotations"] == {
        "thundercompute.com/thunder-gpu-type": "A6000",
        "thundercompute.com/thunder-zone": "us-east-1",
    }
    spec = manifest["spec"]
    assert spec["driver"] == "thundercompute.com"
    assert spec["pool"] == {"name": "us-east-1/a6000", "generation": 3, "resourceSliceCount": 1}
    assert spec["nodeSelector"] == {
        "nodeSelectorTerms": [
            {
                "matchExpressions": [
                    {
                        "key": "topology.kubernetes.io/zone",
                        "operator": "In",
                        "values": ["us-east-1"],
                    },
                    {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
                ]
            }
        ]
    }
    assert spec["devices"][0] == {
        "name": "a6000-0",
        "attributes": {
            "thundercompute.com/gpu_type": {"string": "A6000"},
            "thundercompute.com/gpu_type_label": {"string": "a6000"},
            "thundercompute.com/zone": {"string": "us-east-1"},
        },
    }


def test_node_selection_follows_the_daemon_selector() -> None:
    spec = ThunderClusterSpec.model_validate(
        {"daemon": {"nodeSelector": {"thundercompute.com/node": "true", "pool": "gpu"}}}
    )
    config = InventoryConfig.from_spec(spec)
    [pool] = build_pools([capacity()], config).pools
    term = pool.manifest(pool.slices[0], 1)["spec"]["nodeSelector"]["nodeSelectorTerms"]
    assert len(term) == 1
    assert [e["key"] for e in term[0]["matchExpressions"]] == [
        "topology.kubernetes.io/zone",
        "pool",
        "thundercompute.com/node",
    ]


def test_unusable_zone_names_are_skipped_with_a_reason() -> None:
    layout = build_pools([capacity(zone="us east"), capacity(zone="eu-west")], CONFIG)
    assert [p.zone_name for p in layout.pools] == ["eu-west"]
    [skipped] = layout.skipped
    assert (skipped.zone_name, skipped.model) == ("us east", "A6000")
    assert "label value" in skipped.reason


def test_awkward_spellings_publish_valid_names() -> None:
    long_model = "NVIDIA " + "Very Long Model Name " * 5
    layout = build_pools(
        [capacity(zone="US.East_1", model="RTX 6000 Ada"), capacity(model=long_model)], CONFIG
    )
    for pool in layout.pools:
        for manifest in pool.manifests(1):
            assert syntax.is_dns_subdomain(manifest["metadata"]["name"])
            assert all(syntax.is_dns_label(d["name"]) for d in manifest["spec"]["devices"])
            assert all(syntax.is_label_value(v) for v in manifest["metadata"]["labels"].values())
    long_pool = next(p for p in layout.pools if p.model == long_model)
    attributes = long_pool.manifest(long_pool.slices[0], 1)["spec"]["devices"][0]["attributes"]
    assert naming.ATTRIBUTE_GPU_TYPE not in attributes
    assert long_pool.annotations[naming.ANNOTATION_GPU_TYPE] == long_model


def test_unchanged_inputs_give_byte_identical_slices() -> None:
    caps = [capacity(published=300), capacity(model="H100", published=7)]
    first = build_pools(caps, CONFIG)
    current = {p.name: p.devices for p in first.pools}
    second = build_pools(caps, CONFIG, current_devices=current)
    dump = [json.dumps(p.manifests(5), sort_keys=False) for p in first.pools]
    assert dump == [json.dumps(p.manifests(5), sort_keys=False) for p in second.pools]


def test_published_devices_reads_the_newest_generation_only() -> None:
    [pool] = build_pools([capacity(published=3)], CONFIG).pools
    new = pool.manifests(2)
    stale = build_pools([capacity(published=5)], CONFIG).pools[0].manifests(1)
    stale[0]["metadata"]["name"] = "leftover"
    foreign = {"metadata": {"labels": {}}, "spec": {"pool": {"name": pool.name}}}
    assert published_devices([*stale, *new, foreign]) == {
        pool.name: frozenset({"a6000-0", "a6000-1", "a6000-2"})
    }


def test_pool_status_reports_what_is_published() -> None:
    [pool] = build_pools([capacity(published=3, target="1.5")], CONFIG).pools
    status = pool.status()
    assert status.to_json_dict() == {
        "zone": "us-east",
        "model": "A6000",
        "pool": "us-east/a6000",
        "physical": 3,
        "target": "1.5",
        "published": 3,
        "liveClients": 0,
    }


def test_a_pool_with_nothing_to_publish_is_left_out() -> None:
    assert build_pools([capacity(published=0)], CONFIG).pools == ()
