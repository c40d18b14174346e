# llamad: `make run` serves the default model, `make test` runs the tests.
# Both set everything up first; setup is idempotent and caches native builds
# outside the repository (see scripts/native.py and src/llamad/_pins.py).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
# The suite runs on two pytest-xdist workers, each taking whole modules
# (--dist loadfile), so a module's shared daemon lives in one worker. Most
# real-model tests give llama one thread and wait on daemons, so one worker
# left the second core idle much of the time: a serial run of a 471-test
# subset (daemon faults, cache faults, the thread-governor tests, unit/cache)
# used 111 s of CPU in 146 s, 0.76 of a core. Back to back on the shared
# machine, two workers took 0.94x, 0.58x and 0.84x the serial wall time (more
# gain the fewer cores the other work held). Test daemons never share a
# port, runtime directory, /dev/shm name or thread board
# (llamad.testing.Launcher), and the tests that count processes,
# read /dev/shm or read the thread board look at their own daemon's only:
# nothing needs the machine to itself, and every test must already pass on a
# loaded machine (with a CPU hog per core: test_make_run_demo). Modules go out
# in collection order (--no-loadscope-reorder): xdist's default sends the
# modules with most tests first, leaving the slow one-test modules for last,
# where one worker can idle while the other finishes them (30-75 s of tail in
# a replay of two serial junit files; collection order ends both within ~5 s;
# the one whole run with the default order ended both within 10 s).
# `make test PYTEST_WORKERS=0` runs every test in one process, one by one.
PYTEST_WORKERS ?= 2
PYTEST_XDIST := -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

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
	$(PY) -m pytest $(PYTEST_XDIST) $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(PY) -m pytest $(PYTEST_XDIST) tests/unit $(PYTEST_ARGS)

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
