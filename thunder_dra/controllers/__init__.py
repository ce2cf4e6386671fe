"""The operator: Thunder inventory into ResourceSlices and DeviceClasses, and the Client reaper.

The pure planning layer (no Kubernetes or Thunder calls) is re-exported here.
"""

from thunder_dra.controllers.capacity import (
    ClientInventory,
    HostInventory,
    OversubscriptionTargets,
    PoolCapacity,
    ZoneInventory,
    compute_capacity,
)
from thunder_dra.controllers.deviceclasses import DesiredDeviceClass, build_device_classes
from thunder_dra.controllers.diff import InventoryPlan, plan_inventory
from thunder_dra.controllers.slices import (
    DesiredPool,
    InventoryConfig,
    OwnerReference,
    build_pools,
    published_devices,
)

__all__ = [
    "ClientInventory",
    "DesiredDeviceClass",
    "DesiredPool",
    "HostInventory",
    "InventoryConfig",
    "InventoryPlan",
    "OversubscriptionTargets",
    "OwnerReference",
    "PoolCapacity",
    "ZoneInventory",
    "build_device_classes",
    "build_pools",
    "compute_capacity",
    "plan_inventory",
    "published_devices",
]
