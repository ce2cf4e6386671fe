"""The DeviceClass selector's form: model test first, and classes of earlier releases
(driver test first) rewritten by the operator's plan, keeping everything else."""

from __future__ import annotations

import copy
import json
from decimal import Decimal
from typing import Any

from thunder_dra.controllers.capacity import PoolCapacity, TargetSource
from thunder_dra.controllers.deviceclasses import build_device_classes
from thunder_dra.controllers.diff import Update, plan_device_classes
from thunder_dra.controllers.slices import InventoryConfig, OwnerReference, build_pools

OWNER = OwnerReference("thundercompute.com/v1alpha1", "ThunderCluster", "thunder", "uid-1")
CONFIG = InventoryConfig(owner=OWNER)


def driver_first(driver: str, label: str) -> str:
    """The selector as releases before the model-first order wrote it."""
    return (
        f"device.driver == {json.dumps(driver)} && "
        f'device.attributes["thundercompute.com"].gpu_type_label == {json.dumps(label)}'
    )


def classes(*models: str) -> list[Any]:
    capacities = [
        PoolCapacity(
            zone_name="us-east",
            model=model,
            physical=2,
            target=Decimal(1),
            target_source=TargetSource.UNSET,
            live_client_gpus=0,
            published=2,
            zone_ids=("us-east",),
        )
        for model in models
    ]
    return list(build_device_classes(build_pools(capacities, CONFIG).pools, CONFIG))


def stored(manifest: dict[str, Any], version: str) -> dict[str, Any]:
    """A class as the API server hands it back, with a user's label and annotation."""
    obj = copy.deepcopy(manifest)
    obj["metadata"].update(
        uid=f"class-{version}",
        resourceVersion=version,
        generation=1,
        creationTimestamp="2026-01-01T00:00:00Z",
        managedFields=[{"manager": "thunder-operator", "operation": "Update"}],
    )
    obj["metadata"]["labels"]["team"] = "ml"
    obj["metadata"]["annotations"]["note"] = "kept"
    return obj


def test_selector_tests_the_model_before_the_driver() -> None:
    [a6000] = classes("A6000")
    assert a6000.manifest()["spec"]["selectors"] == [
        {
            "cel": {
                "expression": 'device.attributes["thundercompute.com"].gpu_type_label == "a6000"'
                ' && device.driver == "thundercompute.com"'
            }
        }
    ]


def test_an_old_form_class_is_rewritten_keeping_metadata_and_other_fields() -> None:
    wanted = classes("A6000", "H100")
    existing = []
    for n, desired in enumerate(wanted):
        obj = stored(desired.manifest(), str(10 + n))
        obj["spec"]["selectors"] = [
            {"cel": {"expression": driver_first(desired.driver_name, desired.type_label)}}
        ]
        existing.append(obj)
    actions = plan_device_classes(wanted, existing)
    assert [type(a) for a in actions] == [Update, Update]
    for action, desired, old in zip(actions, wanted, existing, strict=True):
        assert isinstance(action, Update)
        assert action.name == desired.name
        body = action.body
        assert body["spec"]["selectors"] == [{"cel": {"expression": desired.selector}}]
        assert body["spec"]["extendedResourceName"] == old["spec"]["extendedResourceName"]
        meta = body["metadata"]
        assert meta["resourceVersion"] == old["metadata"]["resourceVersion"], "optimistic write"
        assert meta["uid"] == old["metadata"]["uid"]
        assert meta["labels"]["team"] == "ml"
        assert meta["annotations"]["note"] == "kept"
        assert "managedFields" not in meta

    # Once rewritten, the next pass has nothing to do.
    rewritten = [stored(a.body, "20") for a in actions if isinstance(a, Update)]
    assert plan_device_classes(wanted, rewritten) == ()


def test_a_class_already_in_the_new_form_is_not_written() -> None:
    wanted = classes("L4")
    assert plan_device_classes(wanted, [stored(wanted[0].manifest(), "7")]) == ()
