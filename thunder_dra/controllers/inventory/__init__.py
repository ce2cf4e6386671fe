"""One inventory pass: Thunder's zones, hosts, clients and targets in, ResourceSlices
and DeviceClasses out (read, size, guard, lay out, plan, publish)."""
