"""The node daemon's DaemonSet, rendered from the ThunderCluster and the operator's
own settings."""
