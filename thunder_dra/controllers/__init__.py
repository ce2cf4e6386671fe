"""The operator: Thunder inventory into ResourceSlices and DeviceClasses, the node
daemon's DaemonSet, and the Client reaper.

Layered by concern, each layer importing only those below it:

- ``process``: the operator process (flags, kopf handlers, leader election, the
  reconcile loop of a ThunderCluster while this replica leads, admission policies);
- ``inventory`` (one pass from Thunder's answer to published objects), ``workload``
  (the daemon DaemonSet) and ``reaper`` (orphaned Client enrollments);
- ``shared``: what several concerns use: the Thunder client built from the token
  Secret, the listings of published objects and claims, Events, the ThunderCluster
  status and the operator's metrics.

``docs/development.md`` has the module map.
"""
