# zarrfs: make demo runs zarrfs on an example store; make test runs the tests.
SHELL := /bin/bash
GO ?= go
PYTHON ?= python3
MINIO_VERSION := v0.0.0-20260212201848-7aac2a2c5b7c
export CGO_ENABLED := 0
export PATH := $(CURDIR)/bin:$(PATH)

.PHONY: build test test-python test-long test-gpu fuzz mutate bench bench-ddp demo pydeps minio clean vet

build:
	$(GO) build -o bin/zarrfs ./cmd/zarrfs

# Python clients the tests compare against (zarr-python 3, numcodecs, numpy,
# tensorstore, xarray) and DALI, whose CPU pipelines run without a GPU. DALI's
# wheel pins an nvCOMP and other GPU packages the tests do not need, so it is
# installed without its dependencies, then with the small ones it imports.
# Then pytest and PyTorch for the Python package's tests, and the package
# itself (editable: its xarray engine is registered by the install).
pydeps: .cache/pydeps.stamp
.cache/pydeps.stamp: integration/requirements.txt integration/requirements-dali.txt python/requirements-test.txt python/pyproject.toml
	mkdir -p .cache
	$(PYTHON) -m pip install -q -r integration/requirements.txt
	$(PYTHON) -m pip install -q --no-deps -r integration/requirements-dali.txt
	$(PYTHON) -m pip install -q -r python/requirements-test.txt
	$(PYTHON) -m pip install -q --no-deps -e ./python
	touch $@

# A real MinIO server for the S3 tests, built once into bin/.
minio: bin/minio
bin/minio:
	GOBIN=$(CURDIR)/bin $(GO) install github.com/minio/minio@$(MINIO_VERSION)

vet:
	$(GO) vet ./...

# The soak test runs on its own, last, so that its counts are printed.
SOAK = $(GO) test -run '^TestSoak$$' -count=1 -v ./integration/ 2>&1 | tee .cache/soak.log | grep -E '^(soak |--- |ok|FAIL|panic)'

# The Python package against real mounts (python/tests); PYTHONPATH makes it
# this tree's code whichever checkout the editable install points at.
PYTEST = ZARRFS_BIN=$(CURDIR)/bin/zarrfs PYTHONPATH=$(CURDIR)/python/src $(PYTHON) -m pytest -p no:cacheprovider
test-python: build pydeps
	$(PYTEST) -q python/tests

test: build pydeps minio vet
	$(GO) test -timeout 75m -skip '^TestSoak$$' ./...
	$(MAKE) --no-print-directory test-python
	set -o pipefail; $(SOAK)

# The slow suites too: the soak test for 5 minutes (ZARRFS_SOAK=DURATION
# sets another), source outages with the default deadlines.
test-long: build pydeps minio
	ZARRFS_LONG=1 $(GO) test -timeout 120m -skip '^TestSoak$$' ./...
	set -o pipefail; ZARRFS_LONG=1 $(SOAK)

# On a machine with an NVIDIA GPU and the nvidia-libnvcomp-cu13 wheel: GPU decode
# byte-identical to the CPU path, damaged input, throughput against all CPU cores;
# then warm and mount with GPU decoding against the CPU, and the view fill rate;
# the Python package's GPU tests (installed first: the xarray engine is registered
# by the install); the end-to-end runs (integration/gpu/e2e.sh:
# direct mode with DALI's GPU reader and kvikio, the loader, GPU memory).
test-gpu: build
	bash integration/gpu/run.sh
	$(GO) build -o bin/gpuview ./integration/bench/gpuview
	bash integration/gpu/fill.sh bin/zarrfs bin/gpuview
	$(PYTHON) -m pip install -q --no-deps --no-build-isolation -e ./python
	$(PYTEST) -q -m gpu python/tests
	bash integration/gpu/e2e.sh bin/zarrfs

FUZZTIME ?= 2m
fuzz:
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

# Breaks behaviours on purpose, one at a time (integration/mutate/mutations.go),
# runs the tests that should notice, and reports which mutations they catch.
# The working tree is never changed: mutants reach the build through
# go test -overlay. Not part of make test; MUTATE=REGEXP picks mutations.
MUTATE ?=
mutate: pydeps minio
	$(GO) run ./integration/mutate -only '$(MUTATE)'

# Benchmarks print ratios against a named peer measured in the same run (BENCHMARKS.md).
bench: build pydeps minio
	bash integration/bench/run.sh
	bash integration/bench/views/run.sh
	bash integration/bench/warm/run.sh
	bash integration/bench/grow/run.sh
	bash integration/bench/virtual/run.sh
	$(GO) test -run '^$$' -bench 'S3ColdFetch' -benchtime 4x ./objectstore/
	$(GO) test -run '^$$' -bench . -benchtime 3x ./integration/
	$(GO) test -run '^$$' -bench 'Open' ./cache/
	PYTHONPATH=$(CURDIR)/python/src ZARRFS_BIN=$(CURDIR)/bin/zarrfs $(PYTHON) -W ignore integration/bench/xarray/bench.py

# Data-parallel training on one mount (integration/ddp/run.sh): torchrun of a small
# U-Net fed by zarrfs's readers, 1 and WORLD ranks, cold and warm, against the
# xarray + DataLoader baseline. DDP_MODE: gpus (one rank a GPU, NCCL), share-gpu
# (the ranks on one GPU) or cpu.
DDP_MODE ?= gpus
bench-ddp: build
	bash integration/ddp/run.sh bin/zarrfs $(DDP_MODE)

demo: build pydeps
	bash integration/demo.sh

clean:
	rm -rf bin .cache
