# Two commands for a fresh machine: `make train` and `make test`. Each builds .venv if needed.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.docs-installed

.PHONY: train toy-text test test-fast test-exhaustive test-gpu test-all rehearse-gpu lint docs docs-serve

# torch is pinned and installed first: a CPU wheel of 2.13.0 lies on these machines, while a bare
# `torch` requirement would pull a multi-GB CUDA build. pyproject.toml asks for torch>=2.11 (the oldest tested: the GPU machine's). Elsewhere,
# TORCH_INDEX=https://download.pytorch.org/whl/cpu takes the CPU wheel from PyTorch's own index (PyPI's
# Linux wheel is the CUDA build); docs/getting-started.md, Install.
TORCH_INDEX ?=
# LibreTranslate, for the slow test that serves an Argos package with it (tests/test_argos.py): a venv of its own,
# since it pins flask, numpy<2 and requests; spaCy for the packages' sentence splitter (ARGOS_CHUNK_TYPE=SPACY).
LT_VENV  := .venv-libretranslate
LT_STAMP := $(LT_VENV)/.installed
$(LT_STAMP):
	test -x $(LT_VENV)/bin/python || $(PYTHON) -m venv $(LT_VENV)
	$(LT_VENV)/bin/python -m pip install --quiet libretranslate==1.9.6 'spacy>=3.7'
	touch $@

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

# The main job: relative positions, the toy model, the embedded toy corpus (configs/config.yaml).
# THREADS=N: torch's CPU threads (relmt-train threads=N); unset: the cores free at start (relmt/runtime.py).
THREADS ?=
train: $(STAMP)
	$(VENV)/bin/relmt-train $(if $(THREADS),threads=$(THREADS))

# The toy corpus that make train generates (and never stores) as text files, for relmt-translate input=, relmt-score
# ref= and relmt-report refs=: data/toy_text/{train,valid,test,test_long}.{src,tgt}, with gold word alignments
# ({split}.align, .align_possible). Seconds; configs/data/toy.yaml's sizes (scripts/reproduce/toy_corpus.py).
toy-text: $(STAMP)
	$(PY) scripts/reproduce/toy_corpus.py data/toy_text

# make test: every test but the exhaustive ones (sweeps, and the two longest benchmark-script runs) and the CUDA
# ones (under 15 minutes on 2 cores: docs/results/performance/make_test/timing.json); test-fast
# also leaves out the slow end-to-end runs; test-exhaustive runs the sweeps alone, test-gpu the tests marked gpu
# (tests/test_cuda.py and the CUDA cases of the attention routes, labels and compiled training), test-all
# everything (the CUDA tests skip without a device).
# The CPU targets run one pytest-xdist worker per core, one thread each (tests/conftest.py); worksteal
# rebalances the long end-to-end tests. XDIST= runs them in one process.
XDIST ?= -n auto --dist worksteal

# THREADS=N: each worker's torch threads (OMP_NUM_THREADS); unset: one per worker (tests/conftest.py)
test: $(STAMP) $(LT_STAMP)
	$(if $(THREADS),OMP_NUM_THREADS=$(THREADS)) $(PY) -m pytest $(XDIST) -m "not exhaustive and not gpu"

test-fast: $(STAMP)
	$(PY) -m pytest $(XDIST) -m "not slow and not exhaustive and not gpu"

test-exhaustive: $(STAMP)
	$(PY) -m pytest $(XDIST) -m exhaustive

test-gpu: $(STAMP)
	$(PY) -m pytest -m gpu

test-all: $(STAMP) $(LT_STAMP)
	$(PY) -m pytest $(XDIST)

# The next GPU lease's calls (scripts/gpu/call.sh 1 and 2) rehearsed on the CPU, every phase at tiny shapes inside
# the device lane, the wheels they carry checked against the GPU image (scripts/gpu/rehearse.sh; a few minutes;
# fetches .whl/ from PyPI once). CI runs it after make test.
rehearse-gpu: $(STAMP)
	PY=$(abspath $(PY)) bash scripts/gpu/rehearse.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check relmt scripts tests

# The documentation site (mkdocs.yml, docs/): `make docs` builds it into site/ and fails on any broken link,
# anchor or page missing from the nav; `make docs-serve` serves it at http://127.0.0.1:8000. Both install the
# `docs` extra (mkdocs, mkdocs-material, mkdocstrings) into .venv first; `make test` does not need it.
$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $@

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve
