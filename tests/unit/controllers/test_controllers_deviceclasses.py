"""DeviceClasses: one per model, selecting exactly the devices slices.py publishes for it."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from thunder_dra.controllers.inventory.capacity import PoolCapacity, TargetSource
from thunder_dra.controllers.inventory.classes import (
    build_device_classes,
    extended_resource_name_dropped,
    selector_expression,
)
from thunder_dra.controllers.inventory.slices import InventoryConfig, build_pools
from thunder_dra.kube import naming


def capacity(zone: str, model: str) -> PoolCapacity:
    return PoolCapacity(
        zone_name=zone,
        model=model,
        physical=2,
        target=Decimal(1),
        target_source=TargetSource.UNSET,
        live_client_gpus=0,
        published=2,
        zone_ids=(zone,),
    )


def test_one_class_per_model_across_zones() -> None:
    pools = build_pools(
        [capacity("us-east", "a6000"), capacity("eu-west", "A6000"), capacity("eu-west", "H100")],
        InventoryConfig(),
    ).pools
    classes = build_device_classes(pools, InventoryConfig())
    assert [c.name for c in classes] == ["thunder-gpu-a6000", "thunder-gpu-h100"]
    assert classes[0].model == "A6000"
    manifest = classes[0].manifest()
    assert manifest["spec"]["extendedResourceName"] == "thundercompute.com/gpu-a6000"
    assert manifest["metadata"]["labels"] == {
        "app.kubernetes.io/name": "thunder-dra-driver",
        "app.kubernetes.io/component": "device-class",
        "thundercompute.com/gpu-type": "a6000",
    }
    assert manifest["metadata"]["annotations"] == {"thundercompute.com/thunder-gpu-type": "A6000"}


def test_empty_prefix_keeps_the_classes_without_an_extended_resource() -> None:
    config = InventoryConfig(extended_resource_prefix="")
    pools = build_pools([capacity("us-east", "A6000")], config).pools
    [device_class] = build_device_classes(pools, config)
    assert "extendedResourceName" not in device_class.manifest()["spec"]
    assert device_class.name == "thunder-gpu-a6000"


def _evaluate(expression: str, driver: str, attributes: dict[str, dict[str, str]]) -> bool:
    """Evaluate the one CEL shape selector_expression produces."""
    match = re.fullmatch(
        r'device\.driver == "(.*)" && device\.attributes\["(.*)"\]\.(\w+) == "(.*)"', expression
    )
    assert match is not None, expression
    want_driver, domain, attribute, value = match.groups()
    attribute_value = attributes.get(f"{domain}/{attribute}", {}).get("string")
    return driver == want_driver and attribute_value == value


@pytest.mark.parametrize("models", [["A6000", "H100"], ["NVIDIA L4", "nvidia-l4"], ["x" * 80]])
def test_each_class_selects_exactly_its_models_devices(models: list[str]) -> None:
    config = InventoryConfig()
    pools = build_pools([capacity("us-east", m) for m in models], config).pools
    classes = build_device_classes(pools, config)
    assert len(classes) == len(models)
    for device_class in classes:
        for pool in pools:
            manifest = pool.manifest(pool.slices[0], 1)
            for device in manifest["spec"]["devices"]:
                selected = _evaluate(
                    device_class.selector, manifest["spec"]["driver"], device["attributes"]
                )
                assert selected == (pool.type_label == device_class.type_label)


def test_selector_expression_names_driver_and_label() -> None:
    assert selector_expression("thundercompute.com", "a6000") == (
        'device.driver == "thundercompute.com" && '
        'device.attributes["thundercompute.com"].gpu_type_label == "a6000"'
    )


def test_a_dropped_extended_resource_name_is_detected() -> None:
    sent = {"spec": {"extendedResourceName": "thundercompute.com/gpu-a6000"}}
    assert extended_resource_name_dropped(sent, {"spec": {"selectors": []}})
    assert not extended_resource_name_dropped(sent, sent)
    assert not extended_resource_name_dropped({"spec": {}}, {"spec": {}})


def test_long_models_get_valid_extended_resource_names() -> None:
    config = InventoryConfig()
    pools = build_pools([capacity("us-east", "Z" * 100)], config).pools
    [device_class] = build_device_classes(pools, config)
    assert device_class.extended_resource_name is not None
    assert naming.is_extended_resource_name(device_class.extended_resource_name)
