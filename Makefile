# llm-rs in Python — every command a learner or CI needs.
#
#   make lab                   set up if needed, open JupyterLab on chapters/
#   make demo                  set up if needed, fetch SmolLM2, run the engine on it
#   make test                  set up if needed, run the whole suite (what CI runs)
#   make test-chapter 1        check your exercises for chapter 1 (IMPL=solutions for ours)
#   make test-exercise E=1.6   check one exercise
#   make check-env             [OK]/[FAIL] for Python, dependencies, model, GPU
#   make notebooks             re-run the notebooks so their stored outputs are current
#
# Set-up is idempotent: a stamp file records that .venv matches pyproject.toml,
# so a second run installs nothing.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.llmrs-setup.stamp
IMPL ?= learner
MODEL_FILE := SmolLM2-135M-Instruct.Q4_1.gguf
PYTEST := $(PY) -m pytest
NBVAL_TIMEOUT ?= 300
# Tests and notebooks run BLAS on one thread: the NumPy backend's matrices are small, and
# two BLAS threads on a busy 2-core machine make them several times slower and noisy.
SINGLE_THREAD := OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

.DEFAULT_GOAL := help
.PHONY: help setup lab demo fetch test test-solutions test-engine check-stubs nbval lint format \
        test-chapter test-exercise check-env notebooks bench bench-tokenizer bench-throughput clean

# `make test-chapter 1`: the chapter number arrives as a goal of its own;
# take it as N and give it an empty rule so make does not try to build it.
ifeq (test-chapter,$(firstword $(MAKECMDGOALS)))
  N ?= $(word 2,$(MAKECMDGOALS))
  ifneq ($(word 2,$(MAKECMDGOALS)),)
    $(eval $(word 2,$(MAKECMDGOALS)):;@:)
  endif
endif

help:
	@sed -n '1,13p' Makefile | sed 's/^# \{0,1\}//'

# -- set-up ---------------------------------------------------------------

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "llm-rs needs Python >= 3.10; found " + sys.version.split()[0] + ". Set PYTHON=python3.1x")'
	@test -x $(PY) || { echo "creating $(VENV) ..."; $(PYTHON) -m venv $(VENV); }
	@echo "installing llmrs_core and its dependencies into $(VENV) (first time: a few minutes) ..."
	@$(PY) -m pip install --disable-pip-version-check -q --upgrade pip
	@$(PY) -m pip install --disable-pip-version-check -q -e '.[dev]'
	@touch $@

setup: $(STAMP)

fetch: $(STAMP)
	@$(VENV)/bin/llmrs fetch

# -- the learner's commands -------------------------------------------------

lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=chapters

demo: fetch
	@$(VENV)/bin/llmrs info
	@echo
	@echo '$$ llmrs generate --chat "What are the three primary colors?" --max-tokens 64'
	@$(VENV)/bin/llmrs generate --chat "What are the three primary colors?" --max-tokens 64

test-chapter: setup
	@if ! [[ "$(N)" =~ ^[0-9]+$$ ]]; then echo "usage: make test-chapter 1   (or N=1; add IMPL=solutions for the reference solutions)"; exit 2; fi
	@dir=tests/ch$$(printf %02d $(N)); \
	if [ ! -d $$dir ]; then echo "chapter $(N) has no exercises yet"; exit 2; fi; \
	$(SINGLE_THREAD) $(PYTEST) $$dir -q --no-header --tb=short --impl $(IMPL)

test-exercise: setup
	@if ! [[ "$(E)" =~ ^[0-9]+\.[0-9]+$$ ]]; then echo "usage: make test-exercise E=1.6   (add IMPL=solutions for the reference solutions)"; exit 2; fi
	@ch=$${E%%.*}; dir=tests/ch$$(printf %02d $$ch); key=ex$$(echo $(E) | tr . _)_; \
	$(SINGLE_THREAD) $(PYTEST) $$dir -q --no-header --tb=short --impl $(IMPL) -k $$key

check-env:
	@if [ -x $(PY) ]; then $(PY) llmrs_core/check_env.py; else $(PYTHON) llmrs_core/check_env.py; fi

# -- the whole suite (CI runs this through .ci/run) ------------------------

test: fetch
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory lint test-solutions check-stubs nbval && \
	echo "make test: all passed in $$(( $$(date +%s) - start )) s"

lint: setup
	$(VENV)/bin/ruff check .

format: setup
	$(VENV)/bin/ruff format llmrs_core solutions tests scripts
	$(VENV)/bin/ruff check --fix .

# exercise tests against the solutions, plus the engine tests (tests/core)
test-solutions: fetch
	$(SINGLE_THREAD) $(PYTEST) tests -q --no-header --impl solutions

# the untouched stubs must fail only with "not implemented"
check-stubs: setup
	$(SINGLE_THREAD) $(PYTEST) tests -q --no-header --impl learner --expect-stubs -m "not core"

nbval: fetch
	LLMRS_IMPL=solutions $(SINGLE_THREAD) $(PYTEST) chapters --nbval-lax --nbval-current-env \
	  --nbval-cell-timeout=$(NBVAL_TIMEOUT) --nbval-sanitize-with tests/nbval_sanitize.cfg \
	  -q --no-header

# prompt processing / generation speed, llama-bench style, with llama.cpp's in the same run
# when llama-cpp-python is installed (`.venv/bin/pip install llama-cpp-python`: a 5-minute build);
# THREADS=N sets the threads of every engine (default 2); results also go to build/bench_speed.json
bench: fetch
	@mkdir -p build
	$(VENV)/bin/llmrs bench speed --backend numba,numpy --threads $(or $(THREADS),2) --output build/bench_speed.json

# offline serving throughput of the continuous-batching engine (chapter 7)
bench-throughput: fetch
	$(VENV)/bin/llmrs bench throughput

# encode speed of our tokenizer against Hugging Face tokenizers (chapter 2)
bench-tokenizer: fetch
	$(PY) -m llmrs_core.tokenizer.bench

# re-run every notebook in place so stored outputs and plots match the code
notebooks: fetch
	$(SINGLE_THREAD) $(PY) scripts/refresh_notebooks.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
