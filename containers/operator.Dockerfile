# syntax=docker/dockerfile:1
# The operator image: `python -m thunder_dra.controllers` as an unprivileged user.
#   docker build -f containers/operator.Dockerfile --build-arg VERSION=0.1.0 -t <image> .
# Build context: the repository root. Dependencies are the exact versions of
# constraints.txt; the build stage turns them and the project into wheels, and the
# runtime stage installs only those wheels (no compiler, no network).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY thunder_dra ./thunder_dra
ARG VERSION=""
# Stamp the version the image is built as (the package reports it in its User-Agent).
RUN if [ -n "$VERSION" ]; then \
      sed -i -E "s/^version = \".*\"/version = \"${VERSION}\"/" pyproject.toml; \
    fi \
 && grep -v -E '^(#|-e )' constraints.txt > /tmp/constraints.txt \
 && pip wheel --wheel-dir /wheels -c /tmp/constraints.txt .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels thunder-device-plugin \
 && groupadd --system --gid 65532 thunder \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin thunder
ARG VERSION=""
LABEL org.opencontainers.image.title="thunder-device-plugin-operator" \
      org.opencontainers.image.description="Thunder DRA driver operator: inventory, DeviceClasses, ResourceSlices, the daemon DaemonSet, the validating webhook" \
      org.opencontainers.image.source="https://github.com/thunder-compute/thunder-device-plugin" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
USER 65532:65532
# Health and probes, Prometheus metrics, the validating webhook (TLS).
EXPOSE 8081 8080 9443
ENTRYPOINT ["python", "-m", "thunder_dra.controllers"]
