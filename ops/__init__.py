"""Tools a platform team runs against its own cluster, from a checkout of this repository.

``python -m ops.preflight`` (``make preflight``) checks a cluster can run the driver;
``python -m ops.deploy install|uninstall|status|logs|purge`` (the make targets of the same
names) installs, inspects and removes a deployment; ``python -m ops.helm_test`` runs the
chart's ``helm test`` check from a workstation. None of it ships in the wheel or the images.
"""
