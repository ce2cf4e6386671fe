"""Building and checking what the project ships, and the generated files it commits.

The wheel and sdist (``build_dist``, ``make build``), the images with docker
(``images.sh``, ``make image-docker``/``push``/``image-buildx``), the OLM bundle
(``bundle``, ``make bundle``; ``build-bundle-validate.sh``, ``make bundle-validate``), the
chart's values reference and schema check (``helm_docs``, ``helm_schema``), the gRPC stubs
(``gen-proto.sh``, ``make proto``) and ``make verify`` (``verify``). It uses the test
platform's pinned binaries and local control plane (``hack.cluster``); nothing in ``hack``
imports it.
"""
