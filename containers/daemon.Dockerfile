# syntax=docker/dockerfile:1
# The node daemon image: `python -m thunder_dra.plugin`, the DRA kubelet plugin.
#   docker build -f containers/daemon.Dockerfile --build-arg VERSION=0.1.0 -t <image> .
# Build context: the repository root. It runs as root in a privileged pod (the
# operator's DaemonSet) because it enters the host's namespaces with nsenter to run
# the Thunder installer and thunderd checks on the host, and writes under the
# kubelet's plugin and CDI directories.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY thunder_dra ./thunder_dra
ARG VERSION=""
RUN if [ -n "$VERSION" ]; then \
      sed -i -E "s/^version = \".*\"/version = \"${VERSION}\"/" pyproject.toml; \
    fi \
 && grep -v -E '^(#|-e )' constraints.txt > /tmp/constraints.txt \
 && pip wheel --wheel-dir /wheels -c /tmp/constraints.txt .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# util-linux: nsenter, to run host commands in the host's mount, PID and network
# namespaces; ca-certificates: the Thunder API and artifact host over https.
RUN apt-get update \
 && apt-get install -y --no-install-recommends util-linux ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels thunder-device-plugin
ARG VERSION=""
LABEL org.opencontainers.image.title="thunder-device-plugin" \
      org.opencontainers.image.description="Thunder DRA driver node daemon: the DRA kubelet plugin, node enrollment, CDI specs and VM guest artifacts" \
      org.opencontainers.image.source="https://github.com/thunder-compute/thunder-device-plugin" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
USER 0:0
ENTRYPOINT ["python", "-m", "thunder_dra.plugin"]
