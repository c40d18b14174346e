# llamad: `make run` serves the default model, `make test` runs the tests.
# Both set everything up first; setup is idempotent and caches native builds
# outside the repository (see scripts/native.py and src/llamad/_pins.py).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup tools native ffi run test test-unit bench lint format clean

setup: ffi tools

# System tools the suite runs (strace, systemd-analyze): installed where this
# user may, else named; .ci/run refuses to run without them.
tools:
	$(PYTHON) scripts/tools.py --install

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,dev]'
	touch $@

native: $(STAMP)
	$(PY) scripts/native.py llama
	$(PY) scripts/native.py model

ffi: native
	$(PY) build_ffi.py
	@# What a pip install does: byte-compile the package once, so no llamad
	@# process compiles its modules at start (each would keep the compiler's
	@# garbage: ~9 MB over a daemon's processes, SPEC P9), even where the
	@# environment says PYTHONDONTWRITEBYTECODE.
	$(PY) -m compileall -q src/llamad

run: setup
	$(PY) -m llamad.cli.demo

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

bench: setup
	$(PY) scripts/native.py llama --tools
	$(PY) -m bench.peers_setup || echo "peers setup failed: bench/peers_bench.py records why and skips that peer"
	$(PY) -m bench.run_all

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench scripts build_ffi.py
	$(VENV)/bin/ruff format --check src tests bench scripts build_ffi.py
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format src tests bench scripts build_ffi.py
	$(VENV)/bin/ruff check --fix src tests bench scripts build_ffi.py

clean:
	rm -rf $(VENV) build src/*.egg-info src/llamad/llama_ffi/_llama.*
