# zarrfs: make demo runs zarrfs on an example store; make test runs the tests.
SHELL := /bin/bash
GO ?= go
# The interpreter that makes the checkout's virtual environment, looked up
# before .venv/bin goes on PATH.
BASE_PYTHON ?= $(shell command -v python3)
MINIO_VERSION := v0.0.0-20260212201848-7aac2a2c5b7c
# Every Python a target or a test runs is the checkout's own environment
# (.venv): two clones on one machine never share an editable install, and
# nothing is installed machine-wide. Scripts that take $PYTHON get it too.
VENV := $(CURDIR)/.venv
export PYTHON := $(VENV)/bin/python
export CGO_ENABLED := 0
export PATH := $(VENV)/bin:$(CURDIR)/bin:$(PATH)
PREFIX ?= /usr/local
# mount(8) looks for mount.fuse.TYPE helpers in /sbin alone: the helper goes
# there for a system-wide PREFIX (/usr/local, /usr); with another PREFIX
# everything stays under it (PREFIX/sbin), and HELPERDIR=/sbin puts the
# helper where mount(8) finds it.
HELPERDIR ?= $(if $(filter /usr/local /usr,$(PREFIX)),/sbin,$(PREFIX)/sbin)
SYSTEMDDIR ?= /etc/systemd/system

.PHONY: build test test-go test-race test-python test-long test-gpu fuzz mutate bench bench-fill bench-ddp demo venv pydeps gpuvenv fixtures minio clean distclean vet install install-systemd uninstall

build:
	$(GO) build -o bin/zarrfs ./cmd/zarrfs

# The binary into PREFIX/bin and mount(8)'s helper for fstab entries of type
# fuse.zarrfs (a link to it, cmd/zarrfs/mounthelper.go) into HELPERDIR;
# DESTDIR stages both for a package. The binary is a release build: no
# paths of the machine that built it, no symbol table or DWARF (a third
# smaller; stack traces keep their function names and lines). The systemd
# units of contrib/ are examples to adjust, installed only by make
# install-systemd.
RELEASE_FLAGS := -trimpath -ldflags='-s -w'
install:
	$(GO) build $(RELEASE_FLAGS) -o bin/zarrfs-release ./cmd/zarrfs
	install -D -m 0755 bin/zarrfs-release $(DESTDIR)$(PREFIX)/bin/zarrfs
	install -d $(DESTDIR)$(HELPERDIR)
	ln -sf $(PREFIX)/bin/zarrfs $(DESTDIR)$(HELPERDIR)/mount.fuse.zarrfs
	@if [ "$(HELPERDIR)" != /sbin ]; then echo "mount(8)'s helper is in $(HELPERDIR); fstab entries of type fuse.zarrfs need it in /sbin (make install HELPERDIR=/sbin)"; fi

# The units name /usr/local/bin/zarrfs; with another PREFIX they are
# rewritten to name the installed binary.
install-systemd:
	install -d $(DESTDIR)$(SYSTEMDDIR)
	for u in contrib/systemd/*; do \
	  sed 's#/usr/local/bin/zarrfs#$(PREFIX)/bin/zarrfs#g' "$$u" > $(DESTDIR)$(SYSTEMDDIR)/$$(basename "$$u") && \
	  chmod 0644 $(DESTDIR)$(SYSTEMDDIR)/$$(basename "$$u") || exit 1; \
	done
	@echo "units in $(DESTDIR)$(SYSTEMDDIR): adjust the source, mountpoint and flags, then systemctl daemon-reload"

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/zarrfs $(DESTDIR)$(HELPERDIR)/mount.fuse.zarrfs
	for u in contrib/systemd/*; do rm -f $(DESTDIR)$(SYSTEMDDIR)/$$(basename "$$u"); done

# The checkout's virtual environment. A real one, not one that sees the
# machine's packages, so that what the tests use is what the requirement
# files say on any machine.
venv: $(VENV)/bin/python
$(VENV)/bin/python:
	@test -n "$(BASE_PYTHON)" || { echo "python3 is needed to make $(VENV)" >&2; exit 1; }
	$(BASE_PYTHON) -m venv $(VENV)

# Python clients the tests compare against (zarr-python 3, numcodecs, numpy,
# tensorstore, xarray) and DALI, whose CPU pipelines run without a GPU. DALI's
# wheel pins an nvCOMP and other GPU packages the tests do not need, so it is
# installed without its dependencies, then with the small ones it imports.
# Then pytest and PyTorch for the Python package's tests, and the package
# itself (editable: its xarray engine is registered by the install). All
# into .venv; the stamp lives there, so a new .venv installs again.
pydeps: $(VENV)/pydeps.stamp
$(VENV)/pydeps.stamp: $(VENV)/bin/python integration/requirements.txt integration/requirements-dali.txt python/requirements-test.txt python/pyproject.toml
	$(PYTHON) -m pip install -q -r integration/requirements.txt
	$(PYTHON) -m pip install -q --no-deps -r integration/requirements-dali.txt
	$(PYTHON) -m pip install -q -r python/requirements-test.txt
	$(PYTHON) -m pip install -q --no-deps -e ./python
	touch $@

# The GPU machine has its Python packages installed machine-wide and no
# network: there .venv sees them (--system-site-packages) and gets only the
# package itself. Made only where no .venv is.
gpuvenv:
	test -x $(PYTHON) || $(BASE_PYTHON) -m venv --system-site-packages --without-pip $(VENV)
	$(PYTHON) -m pip install -q --no-deps --no-build-isolation -e ./python

# Zarr stores written by tensorstore for the conformance and mount tests
# (internal/fixtures): written again when the script changes, else a no-op.
# The tests run the script themselves too, for a lone go test or pytest.
fixtures: pydeps
	$(PYTHON) internal/fixtures/make_tensorstore.py .cache/fixtures/tensorstore

# A real MinIO server for the S3 tests, built once into bin/.
minio: bin/minio
bin/minio:
	GOBIN=$(CURDIR)/bin $(GO) install github.com/minio/minio@$(MINIO_VERSION)

vet:
	$(GO) vet ./...

# The soak test runs on its own, last, so that its counts are printed; when
# it fails, so are the lines that say why (its log without the warms that
# the faults fail, which are allowed).
SOAK = $(GO) test -run '^TestSoak$$' -count=1 -v ./integration/ 2>&1 | tee .cache/soak.log | grep -E '^(soak |--- |ok|FAIL|panic)'; \
	rc=$${PIPESTATUS[0]}; \
	if [ $$rc != 0 ]; then echo "== the soak's log (.cache/soak.log), but its failed warms:"; grep -v 'warm failed: ' .cache/soak.log | tail -80; fi; \
	exit $$rc

# The Python package against real mounts (python/tests), with the reason of
# every skip (-rs).
PYTEST = ZARRFS_BIN=$(CURDIR)/bin/zarrfs $(PYTHON) -m pytest -p no:cacheprovider -q -rs

# go test -json through internal/testreport: a line per package with its
# counts, the output of failed tests, every skip with its reason, totals.
GOTEST = set -o pipefail; $(3) $(GO) test -json $(2) 2>&1 | $(GO) run ./internal/testreport -totals .cache/totals-$(1)
# Every Go test but the soak, which make test runs on its own, last.
GOSUITE = $(call GOTEST,go,-timeout 75m -skip '^TestSoak$$' ./...)
# The packages whose goroutines share memory (the delivery server and its
# rings' fake driver, the decode pipeline, fills, the cache, the memory
# budget), once more under the race detector (whose runtime needs cgo: the
# test binaries', never zarrfs's).
RACE = $(call GOTEST,race,-race -count=1 -timeout 30m ./deliver ./decode ./gpu ./fill ./cache ./internal/memory,CGO_ENABLED=1)

test-go: build pydeps fixtures minio vet
	$(GOSUITE)

test-race: build pydeps fixtures minio
	$(RACE)

test-python: build pydeps fixtures
	set -o pipefail; $(PYTEST) python/tests 2>&1 | tee .cache/pytest.log

# Go, Python and soak run even when an earlier part failed, so one run shows
# every failure; the totals of both come last.
test: build pydeps fixtures minio vet
	@rc=0; \
	$(GOSUITE) || rc=1; \
	echo "== the race detector"; ($(RACE)) || rc=1; \
	$(MAKE) --no-print-directory test-python || rc=1; \
	($(SOAK)) || rc=1; \
	echo "== totals"; cat .cache/totals-go; echo "race: $$(cut -d' ' -f2- .cache/totals-race)"; \
	echo "pytest: $$(grep -E '[0-9]+ (passed|failed|error)' .cache/pytest.log | tail -1 | sed -E 's/^=+ //; s/ =+$$//')"; \
	exit $$rc

# The slow suites too: the soak test for 5 minutes (ZARRFS_SOAK=DURATION
# sets another), source outages with the default deadlines.
test-long: build pydeps fixtures minio
	ZARRFS_LONG=1 $(GO) test -timeout 120m -skip '^TestSoak$$' ./...
	export ZARRFS_LONG=1; $(SOAK)

# On a machine with an NVIDIA GPU and the nvidia-libnvcomp-cu13 wheel: GPU decode
# byte-identical to the CPU path, damaged input, throughput against all CPU cores;
# then warm and mount with GPU decoding against the CPU, and the view fill rate;
# the Python package's GPU tests (in .venv made by gpuvenv: the xarray engine is
# registered by the install); the end-to-end runs (integration/gpu/e2e.sh:
# direct mode with DALI's GPU reader and kvikio, the loader, GPU memory).
test-gpu: build gpuvenv
	bash integration/gpu/run.sh
	$(GO) build -o bin/gpuview ./integration/bench/gpuview
	bash integration/gpu/fill.sh bin/zarrfs bin/gpuview
	$(PYTEST) -m gpu python/tests
	bash integration/gpu/e2e.sh bin/zarrfs
	$(GO) build -o bin/chunkdamage ./integration/gpu/chunkdamage
	bash integration/gpu/deliver.sh bin/zarrfs

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
# go test -overlay, and pytest through a copy of python/src. Not part of make test; MUTATE=REGEXP picks mutations.
MUTATE ?=
mutate: pydeps minio
	$(GO) run ./integration/mutate -python $(PYTHON) -only '$(MUTATE)'

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
	$(GO) test -run '^$$' -bench 'ZstdDecoders|UnshuffleStream' -count 3 ./codec/
	ZARRFS_BIN=$(CURDIR)/bin/zarrfs $(PYTHON) -W ignore integration/bench/xarray/bench.py

# The fill's roofline (the machine's read and write floors, the fill's CPU by
# stage) and its peers (zarr-python, zarrs, tensorstore) on the ERA5-like
# view, whole-command warms and the first epoch over a cold mount
# (integration/bench/fill/run.sh; STEPS, STORES, PARTS, ZARRFS_OLD there).
bench-fill: build pydeps
	bash integration/bench/fill/run.sh bin/zarrfs

# Data-parallel training on one mount (integration/ddp/run.sh): torchrun of a small
# U-Net fed by zarrfs's readers, 1 and WORLD ranks, cold and warm, against the
# xarray + DataLoader baseline. DDP_MODE: gpus (one rank a GPU, NCCL), share-gpu
# (the ranks on one GPU) or cpu.
DDP_MODE ?= gpus
bench-ddp: build gpuvenv
	bash integration/ddp/run.sh bin/zarrfs $(DDP_MODE)

# The Go build and numpy alone (integration/demo.sh): python3's, or a small
# environment of its own in .cache; make test installs the rest.
demo: build
	bash integration/demo.sh

clean:
	rm -rf bin .cache

# Also the virtual environment (some GB; make pydeps makes it again).
distclean: clean
	rm -rf $(VENV)
