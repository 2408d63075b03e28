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

setup: $(STAMP)

run: setup
	$(BIN)/stabilizer run --local $(ARGS)

test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) cdk.out .pytest_cache runs
