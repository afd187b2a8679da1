# Two commands do all set-up on a fresh Debian machine (README.md):
#   make demo   origin, edge and sample Node.js backends on localhost
#   make test   ruff + the whole pytest suite
# Every target installs what it needs and is idempotent: stamps record what
# was installed, and are redone when the file they depend on changes.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
NODE_APP := deploy/node-app
STAMPS := $(VENV)/.stamps

.PHONY: venv node test lint demo bench-tunnel bench-edge bench-tls-floor wan soak apt-base clean

# Debian packages: python3-venv/nodejs on a bare machine, and what the tests use
# for real peers (haproxy) and the WAN emulator (iptables, libnetfilter-queue).
APT_PACKAGES := haproxy wrk iptables iproute2 libnetfilter-queue-dev gcc python3-dev

$(STAMPS)/apt-base:
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

# The test suite includes a quick run of the WAN proof (locust, matplotlib), so
# it installs the load extras too.
$(STAMPS)/py-test: pyproject.toml $(VENV)/bin/python
	@mkdir -p $(STAMPS)
	$(PY) -m pip install -q -e '.[test,load]'
	@touch $@

$(STAMPS)/py-load: $(STAMPS)/py-test
	@touch $@

$(NODE_APP)/node_modules/.stamp: $(NODE_APP)/package.json | $(STAMPS)/apt-base
	cd $(NODE_APP) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

venv: $(STAMPS)/py-test
node: $(NODE_APP)/node_modules/.stamp

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: venv node lint
	$(VENV)/bin/pytest -q

demo: venv node
	$(VENV)/bin/geoedge demo

bench-tunnel: venv
	$(PY) -m loadtests.bench_tunnel

bench-edge: $(STAMPS)/py-load node
	$(PY) -m loadtests.bench_edge

bench-tls-floor: $(STAMPS)/py-load node
	$(PY) -m loadtests.tls_floor

wan: $(STAMPS)/py-load node
	$(PY) -m loadtests.wan.run

# 30 minutes by default; e.g. make soak SOAK_ARGS="--websockets 9000 --cycles 3"
soak: $(STAMPS)/py-load node
	$(PY) -m loadtests.soak $(SOAK_ARGS)

clean:
	rm -rf $(VENV) $(NODE_APP)/node_modules
