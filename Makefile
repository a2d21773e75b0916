# Two commands for a newcomer: `make run` starts Warren, `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/warren serve

test: $(STAMP)
	$(BIN)/pytest

test-fast: $(STAMP)
	$(BIN)/pytest -m "not slow"

bench: $(STAMP)
	$(BIN)/warren bench log

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis
