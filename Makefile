# Two commands a newcomer needs:  `make run`  and  `make test`.  Both set everything up first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Python compiles a module on its first import and keeps the bytecode, unless PYTHONDONTWRITEBYTECODE
# is set (some machine images set it): then every process compiles torch again, and each real run a
# test starts is a process (`import torch` 4.1 s against 1.9 s; docs/figures.md). These targets keep
# bytecode, in .venv/pycache, never beside the sources.
export PYTHONDONTWRITEBYTECODE :=
export PYTHONPYCACHEPREFIX ?= $(abspath $(VENV))/pycache

.PHONY: setup run test test-fast test-all lint clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	# torch is pinned in pyproject (torch==2.13.0): this machine kind carries that CPU build on disk.
	$(BIN)/pip install --quiet --upgrade pip
	# --no-compile: byte-compiling every installed module (torch, botocore, the CDK) took most of the
	# install's minutes; Python compiles what is imported, once, on first import (above).
	$(BIN)/pip install --quiet --no-compile -e '.[dev]'
	touch $(STAMP)

# The pinned CDK CLI (npm aws-cdk, see package.json) for `npx cdk synth|deploy`, and the Lambda
# dependency wheels for python3.13 (cached outside the tree), so synth afterwards runs offline.
NPM_STAMP := node_modules/.package-lock.json

$(NPM_STAMP): package-lock.json
	npm ci --no-audit --no-fund

setup: $(STAMP) $(NPM_STAMP)
	$(BIN)/python -m infra.lambda_asset

run: setup
	$(BIN)/stabilizer run --local $(ARGS)

# One pytest worker per core and one more (pytest-xdist), at most four: many tests wait on a process
# they started (a job's first checkpoint, a hang's timeout), and the extra worker keeps the cores busy
# meanwhile (two cores, bytecode kept: 390 s against 526 s with two workers; docs/figures.md). Each worker imports
# torch, the CDK and moto and starts its own jsii runtime. Workers take tests one by one in collection
# order, the long end-to-end runs first; tests that share an expensive fixture (a synth, one local
# execution) carry the same `xdist_group` and run on one worker. `make test WORKERS=0` runs in this process.
WORKERS ?= $(shell $(PYTHON) -c "import os; cores = getattr(os, 'sched_getaffinity', lambda _: range(os.cpu_count() or 1))(0); print(min(len(cores) + 1, 4))")
XDIST = -n $(WORKERS) --maxprocesses 4 --dist loadgroup

# The tiers (docs/layout.md, "Tests"): `make test` is the fast tier and small real runs, one or two for each
# path (what CI runs); `make test-all` adds the long ones (tests marked `long`: the whole notebook,
# the scenario set, many hosts, the detection corpus, the other variants of a path); `make test-fast`
# is what starts no process and trains nothing (tests marked `slow` left out; tests/conftest.py
# fails any other test that starts a process).
test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -m "not long" $(XDIST) $(PYTEST_ARGS)

test-all: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -m "not slow" $(XDIST) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) cdk.out .pytest_cache runs build dist *.egg-info
