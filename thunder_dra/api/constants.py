"""Names fixed by the product spec that the API models and the CRDs are built around.

They live at the bottom layer so the models can use them as defaults; the shared
Kubernetes helpers (`thunder_dra.kube.naming`) re-export them for everyone else.
"""

from typing import Final

DOMAIN: Final = "thundercompute.com"
"""The one domain everything lives under: API group, DRA driver, labels, attributes."""

GROUP: Final = DOMAIN
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

DEFAULT_DRIVER_NAME: Final = DOMAIN
APP_NAME: Final = "thunder-dra-driver"
"""Value of `app.kubernetes.io/name` on everything the driver creates."""

THUNDER_CLUSTER_KIND: Final = "ThunderCluster"
THUNDER_CLUSTER_PLURAL: Final = "thunderclusters"
CLIENT_KIND: Final = "Client"
CLIENT_PLURAL: Final = "clients"
CLIENT_FINALIZER: Final = f"{DOMAIN}/client-cleanup"
"""Holds a Client until its Thunder enrollment has been revoked."""
