"""What more than one of the operator's concerns uses: the Thunder client built from
the token Secret, the listings of published objects and claims, Events, the
ThunderCluster status and the operator's metrics."""
