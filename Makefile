# Two commands a newcomer needs:  `make run`  and  `make test`.  Both set everything up first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test lint clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	# torch is pinned in pyproject (torch==2.13.0): this machine kind carries that CPU build on disk.
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
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

test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) cdk.out .pytest_cache runs build dist *.egg-info
