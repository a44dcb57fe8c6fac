# silod: `make run` runs the demo, `make test` runs the whole suite. Both set up everything they need.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
APT_PACKAGES := fuse3 libfuse3-dev pkg-config faketime e2fsprogs openssl nftables iproute2 fiu-utils strace
PROTO_SRC := proto/silodpb/v1/datamgr.proto

.PHONY: setup system-packages run test test-fast test-external lint unit bench bench-pytorch proto clean

setup: system-packages $(VENV)/.installed node_modules/.installed

# Debian packages: FUSE 3 for mounts and pyfuse3's build, libfaketime for the clock-jump test, nftables and ss
# (iproute2) for the half-open connection test, Node.js for Azurite.
# Installs only what is missing: not installed, or removed with its configuration files left (which `dpkg -s` takes
# for present).
system-packages:
	@missing=""; \
	for p in $(APT_PACKAGES); do \
		[ "$$(dpkg-query -W -f='$${db:Status-Status}' $$p 2>/dev/null)" = installed ] || missing="$$missing $$p"; \
	done; \
	command -v npm >/dev/null 2>&1 || missing="$$missing nodejs npm"; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

# The install compiles the scheduler's hot modules in place with mypyc (setup.py), so it is redone whenever one
# of its sources changes: Python runs a compiled copy in preference to its source.
SCHEDULER_SOURCES := $(shell find datamgr/scheduler -name '*.py')

$(VENV)/.installed: pyproject.toml setup.py $(SCHEDULER_SOURCES)
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@echo "installing silod and compiling its scheduler modules with mypyc (about a minute)"
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

run: setup
	$(VENV)/bin/silod demo

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The suite runs in TEST_WORKERS processes (pytest-xdist), each taking whole test modules at a time (`--dist
# loadfile`: a module's tests were written to run one after another). Most tests wait on servers, mounts and
# subprocesses, where one process keeps about one core busy: on 2 cores, 4 workers ran it in 520 s and one
# process in 823 s (2026-11-27).
# TEST_WORKERS=0 runs the suite in this one process (pytest's own output, easier to debug).
TEST_WORKERS ?= 4

unit: setup
	$(PY) -m pytest -m "not external" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test: lint unit

# The first two test tiers (tests/conftest.py): no servers, no mounts, about a minute; `make test` runs them all.
test-fast: setup
	$(PY) -m pytest -m "unit or fuse_ops" $(PYTEST_ARGS)

# Tests that need a tool the package registries do not have (kubectl 1.21+); they fail where it is missing.
test-external: setup
	$(PY) -m pytest -m external $(PYTEST_ARGS)

bench: setup
	PYTHONPATH=$(CURDIR) $(PY) bench/cli_startup.py
	PYTHONPATH=$(CURDIR) $(PY) bench/control_plane.py
	PYTHONPATH=$(CURDIR) $(PY) bench/epoch_read.py
	PYTHONPATH=$(CURDIR) $(PY) bench/cache_read.py
	PYTHONPATH=$(CURDIR) $(PY) bench/fuse_floor.py
	PYTHONPATH=$(CURDIR) $(PY) bench/manifest_memory.py
	PYTHONPATH=$(CURDIR) $(PY) bench/read_buffers.py
	PYTHONPATH=$(CURDIR) $(PY) bench/read_deadline.py
	PYTHONPATH=$(CURDIR) $(PY) bench/scheduler_round.py
	PYTHONPATH=$(CURDIR) $(PY) bench/sim_scenario.py
	PYTHONPATH=$(CURDIR) $(PY) bench/sim_floor.py
	PYTHONPATH=$(CURDIR) $(PY) bench/harmony_schedule.py

# The real-client benchmark needs torch and torchvision, which the suite must not: they go into an environment of
# their own (a large download the first time: PyPI's torch wheels carry CUDA libraries).
PYTORCH_VENV := .venv-pytorch

$(PYTORCH_VENV)/.installed: pyproject.toml setup.py $(SCHEDULER_SOURCES)
	@test -x $(PYTORCH_VENV)/bin/python || python3 -m venv $(PYTORCH_VENV)
	$(PYTORCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(PYTORCH_VENV)/bin/python -m pip install -q -e '.[test]' torch torchvision
	@touch $@

bench-pytorch: setup $(PYTORCH_VENV)/.installed
	PYTHONPATH=$(CURDIR) $(PYTORCH_VENV)/bin/python bench/pytorch_loader.py $(BENCH_ARGS)

# Regenerate the gRPC stubs (committed, so installs need no protoc).
proto: setup
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m grpc_tools.protoc -Iproto --python_out=. --grpc_python_out=. --mypy_out=. --mypy_grpc_out=. $(PROTO_SRC)

clean:
	rm -rf $(VENV) $(PYTORCH_VENV) node_modules .mypy_cache .pytest_cache .ruff_cache build
	find datamgr -name '*.so' -delete
