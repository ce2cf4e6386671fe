# thunder-device-plugin: every development task. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Python caches compiled modules (and pytest its rewritten test modules) in __pycache__
# (git-ignored) even where the environment asks it not to: without them every run, and
# every operator, daemon and fake Thunder process the tests start, compiles from source
# (3.5 s of each unit run's 5.8 s collection).
unexport PYTHONDONTWRITEBYTECODE
# As root (CI, these machines) the real-node tests and demo run: build what they need
# first (node components, images). Elsewhere they skip or fall back, saying why.
NODE_PREREQS := $(if $(filter 0,$(shell id -u)),node-tools image)
# The real-node tests also scrape the chart's pods with a real Prometheus, install the
# bundle with a real OLM and upgrade from the last release (its images built first).
NODE_TEST_PREREQS := $(if $(filter 0,$(shell id -u)),prometheus olm last-release)

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	@touch $@

.PHONY: venv
venv: $(STAMP) ## Create the virtual environment with pinned packages

.PHONY: tools
tools: ## Build (once, cached) etcd, kube-apiserver, scheduler, controller-manager, kubectl, helm
	@hack/build-tools.sh >/dev/null

.PHONY: proto
proto: $(STAMP) ## Regenerate the Python gRPC stubs from proto/
	release/gen-proto.sh

.PHONY: crds
crds: $(STAMP) ## Regenerate crds/ and docs/configuration.md from the pydantic models
	$(PY) -m thunder_dra.api.crdgen
	$(PY) -m thunder_dra.api.docgen

.PHONY: lint
lint: $(STAMP) ## ruff lint and format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

.PHONY: typecheck
typecheck: $(STAMP) ## mypy --strict
	$(VENV)/bin/mypy --strict thunder_dra hack ops release tests $(wildcard bench/*.py)

# The unit tests share no state between tests but their own process's caches, so they run
# on every CPU (pytest-xdist). UNIT_WORKERS=0 runs them in the one pytest process.
UNIT_WORKERS ?= auto
.PHONY: unit
unit: $(STAMP) tools ## Unit tests only (no cluster; chart renders use the built helm), on every CPU
	@hack/ensure-promtool.sh
	$(VENV)/bin/pytest tests/unit -m unit -q -n $(UNIT_WORKERS) $(PYTEST_ARGS)

.PHONY: check
check: lint typecheck unit helm-lint helm-schema ## Lint, type-check, unit tests and offline chart verification

# A test that skips and is not listed, with its reason, in tests/expected-skips.txt fails
# these targets (tests/support/skips.py). THUNDER_STRICT_SKIPS=0 lets a machine that lacks
# what CI has (root, the node components) run them with skips.
THUNDER_STRICT_SKIPS ?= 1

.PHONY: test
test: $(STAMP) tools $(NODE_PREREQS) $(NODE_TEST_PREREQS) ## Every test: unit, integration (local control plane), end-to-end, the real node (root)
	@hack/ensure-runc.sh
	@hack/ensure-promtool.sh
	THUNDER_STRICT_SKIPS=$(THUNDER_STRICT_SKIPS) $(VENV)/bin/pytest $(PYTEST_ARGS)

.PHONY: test-local
test-local: $(STAMP) tools $(NODE_PREREQS) $(NODE_TEST_PREREQS) ## Integration and end-to-end tests on the embedded local control plane (and the real node, as root)
	@hack/ensure-runc.sh
	@hack/ensure-promtool.sh
	THUNDER_STRICT_SKIPS=$(THUNDER_STRICT_SKIPS) $(VENV)/bin/pytest -m "integration or e2e" $(PYTEST_ARGS)

.PHONY: cover
cover: $(STAMP) tools ## Every test with a coverage report of thunder_dra
	$(VENV)/bin/coverage run --source=thunder_dra -m pytest -q $(PYTEST_ARGS)
	$(VENV)/bin/coverage report --skip-empty

.PHONY: cluster-up
cluster-up: $(STAMP) tools ## Start the local control plane in the background (VERSION=1.34 to emulate)
	$(PY) -m hack.cluster up $(if $(VERSION),--emulated-version $(VERSION))
	@echo 'use it with: eval "$$($(PY) -m hack.cluster env)"'

.PHONY: cluster-down
cluster-down: $(STAMP) ## Stop the local control plane started by cluster-up
	$(PY) -m hack.cluster down

.PHONY: demo
demo: $(STAMP) tools $(NODE_PREREQS) ## Run the driver end to end (on a real node as root, else simulated nodes) and show it working
	$(PY) -m hack.demo

.PHONY: bench-kubelet
bench-kubelet: $(STAMP) tools ## The kubelet's prepare/unprepare calls to the daemon beside a minimal Go plugin's; writes docs/benchmarks.md
	$(PY) -m bench.kubelet_calls --write-docs

.PHONY: lock
lock: ## Re-resolve the pinned package versions into constraints.txt
	rm -rf .lock-venv && python3 -m venv .lock-venv
	.lock-venv/bin/pip install -q -e '.[dev]'
	{ echo "# Exact versions CI installs (pip install -c constraints.txt). Regenerate with: make lock"; \
	  .lock-venv/bin/pip freeze --exclude-editable | grep -v '^-e'; } > constraints.txt
	rm -rf .lock-venv

.PHONY: clean
clean: ## Remove the virtual environment and caches in the tree
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis build dist *.egg-info

.PHONY: layers
layers: $(STAMP) ## Check that thunder_dra's imports run one way: no import cycles, no upward imports
	$(PY) -m hack.layers

# -- packaging and operations (charts/, config/, bundle/, containers/) ----------------
TOOLS_BIN = $(shell hack/build-tools.sh --print)
HELM = $(TOOLS_BIN)/helm
CHART := charts/thunder-device-plugin

.PHONY: build
build: $(STAMP) ## Wheel and sdist into dist/, version stamped (BUILD_VERSION=0.2.0 for a release)
	$(PY) -m release.build_dist

.PHONY: image
image: $(STAMP) ## Operator and daemon images as OCI archives, no docker: Debian packages + wheels (root; cached)
	@hack/build-node-tools.sh --debs
	$(PY) -m hack.image build

.PHONY: image-docker
image-docker: ## Operator and daemon images from containers/ with docker (needs a docker engine)
	release/images.sh build

.PHONY: node-tools
node-tools: ## Build (once, cached) kubelet, containerd and the pause image; install runc, CNI plugins (root)
	@hack/build-node-tools.sh >/dev/null

.PHONY: prometheus
prometheus: ## Build (once, cached) the Prometheus server the real-node tests scrape the chart with
	@hack/build-prometheus.sh >/dev/null

.PHONY: olm
olm: ## Build (once, cached) OLM's olm and catalog operators and opm, with OLM's CRDs, for the real-node OLM test
	@hack/build-olm.sh >/dev/null

.PHONY: last-release
last-release: $(STAMP) ## Build (once, cached) the images of the last release (release/last-release), which the upgrade tests start from (root)
	@$(PY) -m hack.node.last_release >/dev/null

.PHONY: node
node: $(STAMP) tools node-tools image ## Local control plane plus a real node (kubelet, containerd) until Ctrl-C (root)
	$(PY) -m hack.node run $$($(PY) -m hack.image print | awk '{print "--image", $$2}')

.PHONY: test-node
test-node: $(STAMP) tools node-tools image prometheus olm last-release ## Only the real-node tests (tests/e2e/node; root): images via runc, the chart on a kubelet + containerd node
	$(VENV)/bin/pytest tests/e2e/node $(PYTEST_ARGS)

.PHONY: node-cleanup
node-cleanup: $(STAMP) ## Remove what a real node whose launcher died left behind (root)
	$(PY) -m hack.node cleanup

# REGISTRY (host[:port]/path) takes the images and, under charts/, the chart; IMAGE_TAG
# is <version>-<UTC time> (default: the commit time of HEAD); a tag the registry has is
# refused. PUSH_CHART=0 pushes only the images.
REGISTRY ?= ghcr.io/thunder-compute
.PHONY: push
push: $(STAMP) tools image ## Push the images (make image's OCI archives, skopeo) and the chart (helm) to REGISTRY (root)
	@hack/ensure-registry.sh
	HELM=$(HELM) $(PY) -m release.push --registry $(REGISTRY) $(if $(IMAGE_TAG),--tag $(IMAGE_TAG)) $(if $(filter 0,$(PUSH_CHART)),--without-chart)

.PHONY: release
release: ## Every test, then push the tested images and the chart pinned to them to REGISTRY, and write the OLM catalog of them ([IMAGE_TAG=...]; root)
	$(MAKE) test
	$(MAKE) push REGISTRY=$(REGISTRY) $(if $(IMAGE_TAG),IMAGE_TAG=$(IMAGE_TAG))
	$(MAKE) catalog REGISTRY=$(REGISTRY) $(if $(IMAGE_TAG),IMAGE_TAG=$(IMAGE_TAG))

# The catalog's bundle is versioned after the release's tag (IMAGE_TAG, by default make
# push's: <version>-<commit time of HEAD>) and names REGISTRY's images of that tag.
.PHONY: catalog
catalog: $(STAMP) ## OLM file-based catalog of bundle/ for the images make push pushed (REGISTRY=..., [IMAGE_TAG=...]) into dist/catalog
	@hack/build-olm.sh >/dev/null
	rm -rf dist/catalog
	$(PY) -m release.catalog --out dist/catalog --registry $(REGISTRY) $(if $(IMAGE_TAG),--tag $(IMAGE_TAG))

.PHONY: push-docker
push-docker: ## Push the images make image-docker built (REGISTRY=..., IMAGE_TAG=...; needs a docker engine)
	release/images.sh push

.PHONY: image-buildx
image-buildx: ## Multi-platform images with docker buildx, pushed (PLATFORMS=...)
	release/images.sh buildx

.PHONY: sync-crds
sync-crds: $(STAMP) tools ## Copy crds/ into the chart, config/ and the bundle
	cp crds/*.yaml $(CHART)/crds/
	cp crds/*.yaml config/crd/bases/
	$(PY) -m release.bundle

.PHONY: helm-lint
helm-lint: tools ## helm lint --strict the chart and the test charts
	$(HELM) lint --strict $(CHART) charts/tests/pod charts/tests/vm

.PHONY: helm-schema
helm-schema: $(STAMP) tools ## Check values.schema.json rejects a misspelled key, naming it
	$(PY) -m release.helm_schema

.PHONY: helm-docs
helm-docs: $(STAMP) tools ## Regenerate the chart README (values, permissions), README.md's settings table and docs/install-names.md
	$(PY) -m release.helm_docs
	$(PY) -m release.settings_table
	$(PY) -m release.names_table

.PHONY: helm-package
helm-package: tools helm-lint ## Package the chart into dist/
	$(PY) -m release.helm_docs --check
	$(HELM) package $(CHART) --destination dist

.PHONY: bundle
bundle: $(STAMP) tools ## Regenerate the OLM bundle in bundle/ from config/
	$(PY) -m release.bundle

.PHONY: bundle-validate
bundle-validate: ## Validate bundle/ with the operator-framework validators (OperatorHub, good practices)
	$$(release/build-bundle-validate.sh) -warnings-as-errors bundle/

.PHONY: verify
verify: $(STAMP) tools ## Chart, examples, config/ and bundle: render, compare, validate, server-side dry-run
	$(PY) -m release.verify

.PHONY: preflight
preflight: $(STAMP) ## Check the current kubeconfig's cluster can run the driver
	$(PY) -m ops.preflight

.PHONY: install
install: $(STAMP) ## Install or upgrade from the local chart (needs THUNDER_API_TOKEN)
	$(PY) -m ops.deploy install

.PHONY: uninstall
uninstall: $(STAMP) ## helm uninstall, after typing the context back (FORCE=1, YES=1)
	$(PY) -m ops.deploy uninstall

.PHONY: status
status: $(STAMP) ## Release, operator, daemon, ThunderCluster and published inventory
	$(PY) -m ops.deploy status

.PHONY: logs
logs: $(STAMP) ## Operator and daemon logs (COMPONENT=operator|daemon, FOLLOW=1)
	$(PY) -m ops.deploy logs

.PHONY: purge
purge: $(STAMP) ## Remove the release and everything the driver wrote (FORCE=1, YES=1)
	$(PY) -m ops.deploy purge
