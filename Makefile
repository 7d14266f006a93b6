# `make train` and `make test` set up .venv on first use (scripts/setup.sh is a no-op when current).
PY := .venv/bin/python

.PHONY: setup train test test-slow lint
setup:
	@bash scripts/setup.sh

train: setup
	@$(PY) train.py $(ARGS)

test: setup
	@bash scripts/run_tests.sh $(ARGS)

test-slow: setup
	@bash scripts/run_tests.sh -m slow $(ARGS)

# ruff (lint, then the formatter's check) and mypy, all configured in pyproject.toml.
lint: setup
	@.venv/bin/ruff check .
	@.venv/bin/ruff format --check .
	@.venv/bin/mypy
