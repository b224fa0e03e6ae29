# The README's two commands are `make run` and `make test`; everything else is tooling.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PORT   ?= 8000

.PHONY: install run test attack lint format bench bench-pool bench-scale clean soak

RUNTIME := $(VENV)/.runtime-stamp

# `make run` needs the runtime dependencies only; `make test` (and the tooling) the dev extra too.
$(RUNTIME): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e .
	touch $(RUNTIME)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(RUNTIME) $(STAMP)

install: $(STAMP)

run: $(RUNTIME)
	PORT=$(PORT) VENV=$(VENV) bash scripts/run.sh

# Two workers (pytest-xdist), each module on one worker so a module's shared fixture (a soak's run, a
# server) is set up once: PostgreSQL's suite 6.8 instead of 10.5 minutes on a 2-CPU machine. TEST_WORKERS=0
# runs it in this process; more workers also hold more PostgreSQL connections.
TEST_WORKERS ?= 2

test: install
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadscope $(PYTEST_ARGS)

# The adversarial suite alone (SECURITY.md, issue 45): attacks against a real server; `make test` runs them too.
attack: install
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadscope -m attack tests $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) var/gateway.sqlite3 var/static

# A real load generator (wrk) on loopback: the gateway under daphne and uvicorn, direct upstream calls and the
# LiteLLM proxy in the same run; writes bench/results.md. BENCH_ARGS="--quick" for a smoke run. It runs in a
# venv of its own, made from the fastest CPython installed here (an optimised build, as production runs:
# bench/interpreter.py); BENCH_PYTHON=/path/to/python chooses one.
BENCH_VENV ?= .venv-bench

bench:
	py=$$($(PYTHON) bench/interpreter.py --venv $(BENCH_VENV) $(if $(BENCH_PYTHON),--use $(BENCH_PYTHON))) && \
	$(MAKE) --no-print-directory install PYTHON="$$py" VENV=$(BENCH_VENV)
	$(BENCH_VENV)/bin/python bench/run.py $(BENCH_ARGS)

# Does a pool pool? 23 rate-limited fake accounts (some failing, healing, hung) and agent-like conversations,
# the gateway with its pool features on and off in one run; writes bench/pool.md and its section of
# bench/results.md (bench/README.md). BENCH_POOL_ARGS="--quick" for a ~1 minute smoke run.
bench-pool:
	py=$$($(PYTHON) bench/interpreter.py --venv $(BENCH_VENV) $(if $(BENCH_PYTHON),--use $(BENCH_PYTHON))) && \
	$(MAKE) --no-print-directory install PYTHON="$$py" VENV=$(BENCH_VENV)
	$(BENCH_VENV)/bin/python bench/pool/run.py $(BENCH_POOL_ARGS)

# Does the gateway's cost stay flat as keys, accounts, ledger history and open streams grow? Each curve's sizes
# side by side in one run (10 to 100,000 keys, 2 to 200 accounts, 0 to 10 million ledger records, 1 to 1,000
# streams and 5,000 idle websockets, 1 and 2 workers), each size a gateway on a database of its own on the
# local PostgreSQL; writes its section of bench/results.md and bench/scale/plots/ (bench/README.md). About
# 18 minutes on 2 quiet CPUs (32 at load 10); BENCH_SCALE_ARGS="--quick" for a ~4 minute smoke run, "--only keys" for one curve.
bench-scale:
	py=$$($(PYTHON) bench/interpreter.py --venv $(BENCH_VENV) $(if $(BENCH_PYTHON),--use $(BENCH_PYTHON))) && \
	$(MAKE) --no-print-directory install PYTHON="$$py" VENV=$(BENCH_VENV)
	$(MAKE) --no-print-directory $(BENCH_VENV)/.bench-extra-stamp
	$(BENCH_VENV)/bin/python bench/scale/run.py $(BENCH_SCALE_ARGS)

# The bench extra (matplotlib, for bench-scale's plots) on top of the dev one.
$(BENCH_VENV)/.bench-extra-stamp: pyproject.toml
	$(BENCH_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	touch $@

# A bounded soak on loopback: the gateway as a real process against chaotic upstreams, then the ledger,
# circuit, leak and memory invariants (soak/README.md). SOAK_ARGS="--requests 2000" for a shorter run;
# SOAK_ARGS="--nodes 3 --database postgres": several nodes on a PostgreSQL of its own, nodes and database failing.
soak: install
	$(VENV)/bin/python soak/main.py $(SOAK_ARGS)
