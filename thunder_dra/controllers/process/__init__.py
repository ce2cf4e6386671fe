"""The operator process: flags, kopf handlers, leader election, and the loop of one
ThunderCluster while this replica leads."""
