# Two commands for a fresh machine: `make train` and `make test`. Each builds .venv if needed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: train test test-fast lint

# torch is pinned and installed first: a CPU wheel of 2.13.0 lies on these machines, while a bare
# `torch` requirement would pull a multi-GB CUDA build. pyproject.toml keeps torch>=2.3.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

# The main job: relative positions, the toy model, the embedded toy corpus (configs/config.yaml).
train: $(STAMP)
	$(VENV)/bin/relmt-train

test: $(STAMP)
	$(PY) -m pytest

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check relmt scripts tests
