# ddp-operator: every entry point a developer or CI needs.
# Slow things (the Python environment, the Kubernetes binaries) are cached under
# $(CACHE), keyed by their pinned versions, and rebuilt only when a pin changes.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

CACHE ?= $(HOME)/.cache/ddp-operator
PYTHON ?= python3
UV_VERSION := 0.13.9
LOCK := requirements/dev.lock
LOCK_HASH := $(shell sha256sum $(LOCK) | cut -c1-12)
UV := $(CACHE)/uv-$(UV_VERSION)/bin/uv
VENV := $(CACHE)/venv-$(LOCK_HASH)
PY := $(VENV)/bin/python
BIN_STAMP := $(CACHE)/bin/.stamp-$(shell sha256sum devcluster/ddp_devcluster/versions.py | cut -c1-12)

export DDP_CACHE := $(CACHE)
export PYTHONPATH := $(CURDIR)/api:$(CURDIR)/client:$(CURDIR)/operator:$(CURDIR)/trainer_image:$(CURDIR)/devcluster
export PATH := $(VENV)/bin:$(PATH)

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

$(UV):
	@echo ">> installing uv $(UV_VERSION) into $(CACHE)"
	$(PYTHON) -m venv $(CACHE)/uv-$(UV_VERSION)
	$(CACHE)/uv-$(UV_VERSION)/bin/pip install -q uv==$(UV_VERSION)

$(VENV)/.ok: | $(UV)
	@echo ">> creating the Python environment $(VENV) from $(LOCK) (torch is large: the first time takes minutes)"
	$(UV) venv -q --allow-existing --python $(PYTHON) $(VENV)
	$(UV) pip sync -q --python $(PY) $(LOCK)
	touch $@

$(BIN_STAMP):
	$(PYTHON) -m ddp_devcluster build
	touch $@

# The kind cluster (`make up`, `make demo`) needs fewer of them (build.KIND_TOOLS): not kwok,
# Kueue or Prometheus, which only the tests run. A new machine builds only those first. The
# builds need nothing but the standard library: they start before the Python environment.
KIND_STAMP := $(subst .stamp-,.stamp-kind-,$(BIN_STAMP))
$(KIND_STAMP):
	$(PYTHON) -m ddp_devcluster build --for kind
	touch $@

.PHONY: venv binaries kind-binaries deps
venv: $(VENV)/.ok ## the pinned Python environment (cached)
binaries: $(BIN_STAMP) ## the control plane, kwok, helm, kueue, prometheus, kind, the registry and the kind node image's kubelet, kubeadm, kube-proxy, containerd, CNI plugins, CoreDNS, local-path-provisioner (cached)
kind-binaries: $(KIND_STAMP) ## only what the kind cluster runs (`make up`, `make demo`)
deps: venv binaries ## everything the tests and the demo need

# One lock per image and one for development, all from pyproject.toml's extras. The images
# install exactly these pins (then the project itself with --no-deps).
COMPILE = $(UV) pip compile -q pyproject.toml --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --no-emit-package ddp-operator

.PHONY: lock
lock: | $(UV) ## re-resolve requirements/*.lock (dev, operator image, trainer image) from pyproject.toml
	$(COMPILE) --extra dev -o $(LOCK)
	$(COMPILE) --extra operator -o requirements/operator.lock
	$(COMPILE) --extra trainer -o requirements/trainer.lock

# The container tools of `make images` and of the kind cluster, from apt, only when missing.
HOST_PACKAGES := podman buildah runc containernetworking-plugins debootstrap iptables conntrack
.PHONY: host-packages
host-packages: ## podman, buildah, runc, debootstrap, ... from apt (only what is missing; root)
	@missing=0; \
	for c in podman buildah runc debootstrap iptables conntrack; do \
	  command -v $$c >/dev/null || { echo ">> $$c is missing"; missing=1; }; \
	done; \
	[ -x /usr/lib/cni/bridge ] || { echo ">> the CNI plugins are missing"; missing=1; }; \
	if [ $$missing = 1 ]; then \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(HOST_PACKAGES); \
	fi

.PHONY: images
images: venv host-packages ## build both images with buildah from local stand-in bases (docs/images.md)
	$(PY) -m ddp_devcluster images

# The Go builds use both cores, the image builds mostly the network and the disk: on a cold
# machine they overlap; warm, both are no-ops within seconds.
.PHONY: deps-and-images
deps-and-images:
	$(MAKE) --no-print-directory -j2 binaries images

.PHONY: lint
lint: venv ## ruff, mypy and hadolint
	$(VENV)/bin/hadolint Dockerfile trainer_image/Dockerfile
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy api/ddp_api client/ddp_client operator/ddp_operator trainer_image/ddp_trainer \
	  devcluster/ddp_devcluster bench

.PHONY: test
.PHONY: crd
crd: venv ## regenerate the CRD (manifests/crd/ and the chart's crds/) from the pydantic API
	$(PY) -m ddp_operator.crd > manifests/crd/ddp.dev_ddpjobs.yaml
	cp manifests/crd/ddp.dev_ddpjobs.yaml helm/ddp-operator/crds/

.PHONY: manifests
manifests: deps ## regenerate manifests/ (RBAC, Deployment) from the Helm chart (a test fails on drift)
	$(PY) helm/render_manifests.py

test: deps-and-images lint ## everything CI runs: lint, type check, the images, and the test suite (two lanes side by side)
	$(PY) -m ddp_devcluster.lanes $(PYTEST_ARGS)

.PHONY: e2e-kind
e2e-kind: deps-and-images ## only the cluster suite and the end-to-end scenarios, on the 4-node kind cluster (podman; reuses `make up`'s)
	$(PY) -m pytest tests/cluster tests/e2e -v -rs $(PYTEST_ARGS)

.PHONY: gpu-check
gpu-check: venv ## on a machine with an NVIDIA GPU: the trainer's CUDA paths, which CI's CPU cannot take (NCCL, fp16 + GradScaler, PerStep over NCCL)
	$(PY) -m pytest -p no:cacheprovider --confcutdir=tests/trainer tests/trainer/cuda_paths.py -v -s $(PYTEST_ARGS)

# A GPU machine without internet has torch but not the rest: `make gpu-wheels` here, then carry
# out/wheels there and run tests/trainer/cuda_offline.sh (docs/benchmarks.md, "CUDA paths on a GPU").
# Left out: torch, the CUDA stack it was built with and torch's own dependencies (the machine's).
GPU_PYTHON_VERSION ?= 3.12
TORCH_SIDE := torch|triton|nvidia-[a-z0-9-]+|cuda-[a-z-]+|sympy|mpmath|networkx|setuptools|scipy
.PHONY: gpu-wheels
gpu-wheels: | $(UV) ## the trainer's dependencies but torch's own, and pytest, as wheels in out/wheels for a GPU machine without internet (GPU_PYTHON_VERSION=3.12)
	@mkdir -p out/wheels
	{ grep -E '^[a-z0-9._-]+==' requirements/trainer.lock | grep -v -E '^($(TORCH_SIDE))==' | sed 's/ .*//'; \
	  grep -E '^(pytest|pytest-timeout|pluggy|iniconfig|packaging|pygments)==' requirements/dev.lock; } | sort -u > out/wheels/requirements.txt
	$(CACHE)/uv-$(UV_VERSION)/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version $(GPU_PYTHON_VERSION) \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d out/wheels -r out/wheels/requirements.txt
	@echo "out/wheels: $$(ls out/wheels/*.whl | wc -l) wheels, $$(du -sh out/wheels | cut -f1); on the GPU machine: bash tests/trainer/cuda_offline.sh"

.PHONY: cluster-up cluster-down
cluster-up: deps ## start the embedded control plane in the background; prints the KUBECONFIG to export
	$(PY) -m ddp_devcluster up --nodes $(or $(NODES),2)

cluster-down: ## stop the embedded control plane started by cluster-up
	$(PY) -m ddp_devcluster down

# The node image's slowest part (the trainer's dependency layers unpacked by its containerd)
# needs only the trainer image, containerd and kind, and the images' push only the registry:
# both are done beside the other Go builds, which that side then helps with.
.PHONY: kind-preload kind-ready
kind-preload: images
	$(PY) -m ddp_devcluster kind-preload

kind-ready:
	$(MAKE) --no-print-directory -j2 kind-binaries kind-preload

.PHONY: up down
up: kind-ready ## a 4-node kind cluster (podman), its registry, the images and the chart; prints the KUBECONFIG (docs/kind.md)
	$(PY) -m ddp_devcluster kind-up

down: ## delete the kind cluster of `make up`, its registry and kind's podman network
	$(PY) -m ddp_devcluster kind-down

.PHONY: demo
demo: kind-ready ## the chart's operator runs the digits example on a 4-machine kind cluster here (as root)
	$(PY) -m ddp_devcluster demo

.PHONY: clean
clean: ## remove the checkout's build outputs (the cache under $(CACHE) stays)
	rm -rf .pytest_cache .mypy_cache .ruff_cache build *.egg-info
