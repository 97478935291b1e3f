# llm-rs in Python — every command a learner or CI needs.
#
#   make lab                   set up if needed, open JupyterLab on chapters/
#   make demo                  set up if needed, fetch SmolLM2, run the engine on it
#   make test                  set up if needed, run the whole suite (what CI runs)
#   make test-chapter 1        check your exercises for chapter 1 (IMPL=solutions for ours)
#   make test-exercise E=1.6   check one exercise
#   make progress              every exercise: not started, in progress, failing or passing; used by the engine?
#   make reset E=1.6           put back the stubs of one exercise (your file is backed up first)
#   make test-portable         the engine's numeric tests with Numba compiling for haswell, then generic
#   make test-slow             the real-model integration checks make test leaves out (pytest -m slow)
#   make nbval-portable        the notebooks of chapters 3-11 and appendix B with Numba compiling for haswell (run after editing one)
#   make fetch-vocab           llama.cpp's vocab test files into .cache/llama-vocab (make test fetches them)
#   make check-env             [OK]/[FAIL] for Python, dependencies, model, GPU
#   make gpu-check             on a machine with an NVIDIA GPU: chapter 9's GPU check (table + JSON)
#   make full-size-check       not CI: Llama-3.2-1B, Qwen2.5-0.5B, Qwen3-0.6B, Gemma-3-1B, Phi-3.5-mini (4 layers)
#                              shapes, random weights, Q4_K_M: 16 greedy tokens against llama.cpp (~45 min, 11 GB disk)
#   make notebooks             re-run the notebooks so their stored outputs are current
#   make observe               a real Prometheus scrapes llmrs serve; checks it agrees with the responses
#   make container             build the image (deploy/Dockerfile); make container-test runs and checks it
#   make container-test-learner   Exercise 12.6: your entrypoint in that image, built and run
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
.PHONY: help setup lab demo fetch fetch-vocab test test-solutions test-slow test-gpu gpu-check full-size-check test-engine test-portable check-stubs nbval lint format \
        test-chapter test-exercise progress reset check-env notebooks bench bench-tokenizer bench-throughput bench-serve bench-all clean \
        observe container container-test container-test-learner

# `make test-chapter 1`: the chapter number arrives as a goal of its own;
# take it as N and give it an empty rule so make does not try to build it.
ifeq (test-chapter,$(firstword $(MAKECMDGOALS)))
  N ?= $(word 2,$(MAKECMDGOALS))
  ifneq ($(word 2,$(MAKECMDGOALS)),)
    $(eval $(word 2,$(MAKECMDGOALS)):;@:)
  endif
endif

help:
	@sed -n '1,21p' Makefile | sed 's/^# \{0,1\}//'

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

# llama.cpp's vocab-only GGUFs and their test vectors (from the llama-cpp-python sdist, sha256-checked)
# into .cache/llama-vocab/ (git-ignored); the tokenizer tests skip without them
fetch-vocab: $(STAMP)
	@$(PY) -m llmrs_core.vocab_fetch

# -- the learner's commands -------------------------------------------------

# Jupyter refuses to start as root without --allow-root, and root is the usual user in containers and
# cloud notebooks: add it there, saying so. AS_ROOT=1 or AS_ROOT= overrides the test; LAB_ARGS are passed on.
AS_ROOT ?= $(shell [ "$$(id -u)" = 0 ] && echo 1)
lab: setup
	@$(if $(AS_ROOT),echo "make lab: running as root (as in most containers): JupyterLab starts with --allow-root";) \
	$(VENV)/bin/jupyter lab --notebook-dir=chapters $(if $(AS_ROOT),--allow-root) $(LAB_ARGS)

demo: fetch
	@$(VENV)/bin/llmrs info
	@echo
	@echo '$$ llmrs generate --chat "What are the three primary colors?" --max-tokens 64'
	@$(VENV)/bin/llmrs generate --chat "What are the three primary colors?" --max-tokens 64

# The learner's commands end on the workbook's own last line: where one fails, the recipe stops make
# with SIGPIPE, which neither make nor the shell reports (exit status 141, still a failure),
# instead of letting make add "make: *** [Makefile:NN: test-chapter] Error 1" below it.
QUIET_FAIL = { kill -PIPE $$PPID; exit 1; }
# exercise tests hold no notebooks: without nbval's plugin (it imports jsonschema) pytest starts seconds sooner
EXERCISE_PYTEST = $(SINGLE_THREAD) $(PYTEST) -p no:nbval

test-chapter: setup
	@if ! [[ "$(N)" =~ ^[0-9]+$$ ]]; then echo "usage: make test-chapter 1   (or N=1; add IMPL=solutions for the reference solutions)"; $(QUIET_FAIL); fi
	@dir=tests/ch$$(printf %02d $(N)); \
	if [ ! -d $$dir ]; then echo "chapter $(N) has no exercises yet"; $(QUIET_FAIL); fi; \
	$(EXERCISE_PYTEST) $$dir -q --no-header --tb=short --impl $(IMPL) || $(QUIET_FAIL)

test-exercise: setup
	@if ! [[ "$(E)" =~ ^[0-9]+\.[0-9]+$$ ]]; then echo "usage: make test-exercise E=1.6   (add IMPL=solutions for the reference solutions)"; $(QUIET_FAIL); fi
	@dir=tests/ch$$(printf %02d $(firstword $(subst ., ,$(E)))); \
	if [ ! -d $$dir ]; then echo "chapter $(firstword $(subst ., ,$(E))) has no exercises yet"; $(QUIET_FAIL); fi; \
	$(EXERCISE_PYTEST) $$dir -q --no-header --tb=short --impl $(IMPL) --exercise $(E) || $(QUIET_FAIL)

progress: setup
	@$(SINGLE_THREAD) $(PY) -m llmrs_core.workbook.progress || $(QUIET_FAIL)

reset: setup
	@if ! [[ "$(E)" =~ ^[0-9]+\.[0-9]+$$ ]]; then echo "usage: make reset E=3.6   (puts back that exercise's stubs; your exercises.py is backed up first)"; $(QUIET_FAIL); fi
	@$(PY) -m llmrs_core.workbook.reset $(E) $(if $(REV),--rev $(REV)) || $(QUIET_FAIL)

check-env:
	@if [ -x $(PY) ]; then $(PY) llmrs_core/workbook/check_env.py; else $(PYTHON) llmrs_core/workbook/check_env.py; fi

# -- the whole suite (CI runs this through .ci/run) ------------------------

# The steps run one after another by default. TEST_JOBS=2 runs two at a time, each step's output
# printed whole when it ends (--output-sync). Measured on 2 cores, that is slower: Numba's threaded
# kernels in two processes contend for the cores, and test-portable's haswell leg took 939 s next
# to nbval, against about 200 s alone.
TEST_JOBS ?= 1
test: fetch fetch-vocab
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory lint && \
	$(MAKE) --no-print-directory -j$(TEST_JOBS) $(if $(filter-out 1,$(TEST_JOBS)),--output-sync=target) \
	  NBVAL_RUN_TESTS=elsewhere nbval test-solutions test-gpu check-stubs test-portable && \
	echo "make test: all passed in $$(( $$(date +%s) - start )) s"

lint: setup
	$(VENV)/bin/ruff check .

format: setup
	$(VENV)/bin/ruff format llmrs_core solutions tests scripts
	$(VENV)/bin/ruff check --fix .

# exercise tests against the solutions, plus the engine tests (tests/core); tests/gpu runs in test-gpu,
# the tests marked slow in test-slow
test-solutions: fetch fetch-vocab
	$(SINGLE_THREAD) $(PYTEST) tests -q --no-header --impl solutions --ignore=tests/gpu -m "not slow"

# real-model integration checks kept out of `make test` for its 25 minutes, each with a fast test of the
# same property in make test (the marker's rule): SmolLM2's batch-invariance cases of issue 26
# (tests/core/test_batch_invariance.py; the tiny model's property test stays). Run it after a change to the
# engine, the scheduler, the KV cache or a kernel; about 5 minutes on 2 cores
test-slow: fetch
	$(SINGLE_THREAD) $(PYTEST) tests -q --no-header --impl solutions --ignore=tests/gpu -m slow

# the GPU kernels and the cuda backend (chapter 9), in a process of their own: on a GPU if the driver
# has one, else in numba-cuda's CUDA simulator (chosen before numba.cuda is imported), plus every
# kernel compiled for sm_90 with compile_ptx (no GPU needed)
test-gpu: setup
	$(SINGLE_THREAD) $(PYTEST) tests/gpu -q --no-header

# chapter 9's GPU check, for a machine with an NVIDIA GPU (277 s on an H200, measured; no network, no set-up:
# it runs with the Python it finds, .venv's if there is one): table last, JSON in build/gpu_check.json
gpu-check:
	@mkdir -p build
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) scripts/gpu_check.py --output build/gpu_check.json

# the engine at the sizes people run (issue 28), against llama.cpp on the same Q4_K_M files: needs a
# reference environment with torch, transformers, gguf, sentencepiece, protobuf and llama-cpp-python (never a
# project dependency, never in CI) and llama.cpp's converter from the llama-cpp-python sdist. Files
# in $$LLMRS_FULL_SIZE_DIR (default ~/.cache/llmrs-full-size), the report in build/full_size.json.
REF_PY ?= /opt/ref-venv/bin/python
LLAMA_CPP_SDIST ?= /opt/ref/src/llama_cpp_python-0.3.36
full-size-check: $(STAMP)
	@test -x $(REF_PY) || { echo "full-size-check needs a reference environment at REF_PY=$(REF_PY). Make one:"; \
	  echo "  python3 -m venv ~/ref-venv"; \
	  echo "  ~/ref-venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu"; \
	  echo "  ~/ref-venv/bin/pip install transformers safetensors gguf sentencepiece protobuf llama-cpp-python==0.3.36"; \
	  echo "  pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36   # llama.cpp's converter is in it"; \
	  echo "then: make full-size-check REF_PY=~/ref-venv/bin/python LLAMA_CPP_SDIST=llama_cpp_python-0.3.36.tar.gz"; \
	  exit 1; }
	@mkdir -p build
	$(REF_PY) scripts/full_size_models.py all --sdist $(LLAMA_CPP_SDIST) --engine-python $(PY) $(FULL_SIZE_ARGS)

# the engine's numeric tests (tests/core, tests/ch08) with Numba compiling for other CPUs than this
# one, so that no tolerance or assembly check holds on one machine only: haswell (AVX2 + FMA,
# 8 lanes) and generic (SSE2: 4 lanes, no FMA), each with a fresh on-disk cache under build/.
# NUMBA_CPU_FEATURES is empty: left unset, Numba adds this CPU's own features (AVX-512, say) to
# the name. OpenBLAS runs its Haswell kernels too where the CPU has AVX2, unless the environment
# chose a core type (some machines set OPENBLAS_CORETYPE because other kernels are wrong there:
# that choice stands). The haswell leg needs AVX2 and FMA to run; without, it is skipped, saying so.
# Where this CPU has AVX2 but no AVX-512 it is skipped too (PORTABLE_ALL=1 runs it): test-solutions
# already ran the engine's tests on 8 lanes with FMA here, so the leg would repeat them (about 230 s).
PORTABLE_CPUS := haswell generic
# what computes no floats and compiles nothing: the tokenizer and the workbook's own mechanics; the
# server, the benchmarks and the A/B tests (HTTP, framing, scheduling, statistics: they compare a
# backend with itself) and the GPU memory pool; the command line's errors, the deploy files, the
# fetch, bad GGUF input, the notebooks' structure, the cache and scheduler checks; the diagnoses of
# chapters 1, 2 and 9-12 (integers, the tokenizer, the CUDA simulator, servers, NumPy); and the mpiexec launches, whose arithmetic
# test_distributed.py checks in one process (ranks compiling into an empty cache at once would take minutes);
# batch invariance, which compares the engine with itself on one target (each row computed alone is the
# code's structure, not a target's rounding; test-solutions holds it); the chat templates, the vocab
# fetch and the family fixtures' self-checks (text and NumPy only), and the quantisation codecs and mixes
# (NumPy's arithmetic, which the Numba target does not change; the Numba kernels' side is test_quant_kernels);
# the source's own structure (module docstrings, package cycles, rooms, the CLI package's table); the file
# formats' readers and writers (GGUF, safetensors, torch .bin: bytes against the reference packages); the
# output stream's text; the float, integer and K-quant codecs (NumPy, as the codecs above); and the
# diagnoses of chapters 3, 4 and 6 (the learner's NumPy code: attention and RoPE, sampling, codecs, GGUF
# parsing; chapters 5 and 7 run the Numba backend's model and stay)
PORTABLE_SKIP := --ignore-glob='tests/core/test_tokenizer*' --ignore-glob='tests/core/test_workbook_*' \
                 --ignore-glob='tests/core/test_server*' --ignore-glob='tests/core/test_bench_*' \
                 --ignore-glob='tests/core/test_ab_*' --ignore-glob='tests/core/test_cost*' \
                 --ignore-glob='tests/core/test_gpu_memory_pool*' --ignore-glob='tests/core/test_prometheus*' \
                 --ignore=tests/core/test_cli_errors.py --ignore=tests/core/test_deploy_files.py \
                 --ignore=tests/core/test_fetch.py --ignore=tests/core/test_gguf_bad_input.py \
                 --ignore=tests/core/test_notebook_sections.py --ignore=tests/core/test_cache_checks.py \
                 --ignore=tests/core/test_scheduler_checks.py --ignore-glob='tests/core/test_diagnose_ch09*' \
                 --ignore-glob='tests/core/test_diagnose_ch1*' --ignore-glob='tests/core/test_diagnose_ch0[12]*' \
                 --ignore=tests/core/test_distributed_mpi.py --ignore=tests/core/test_batch_invariance.py \
                 --ignore-glob='tests/core/test_chat_template*' --ignore=tests/core/test_vocab_fetch.py \
                 --ignore=tests/core/test_family_fixtures.py --ignore=tests/core/test_quant_types.py \
                 --ignore=tests/core/test_check_env.py --ignore=tests/core/test_make_lab.py \
                 --ignore=tests/core/test_module_docstrings.py --ignore=tests/core/test_package_cycles.py \
                 --ignore=tests/core/test_rooms.py --ignore=tests/core/test_format_cycles.py \
                 --ignore=tests/core/test_cli_package.py --ignore=tests/core/test_gguf_reader.py \
                 --ignore=tests/core/test_safetensors.py --ignore=tests/core/test_torch_bin.py \
                 --ignore=tests/core/test_output_stream.py --ignore=tests/core/test_quant_floats.py \
                 --ignore=tests/core/test_quant_integer.py --ignore=tests/core/test_kquants.py \
                 --ignore-glob='tests/core/test_diagnose_ch0[346]*'
# The legs run side by side, one Numba thread each (NUMBA_NUM_THREADS=1): each leg is mostly
# compiling into its empty cache, which is one thread's work, and the target's arithmetic does not
# depend on the thread count (test-solutions runs the kernels on all threads). Each leg's output is
# printed whole when it ends, in the legs' order; a leg that fails fails the target.
test-portable: fetch
	@total=$$(date +%s); mkdir -p build; \
	avx2=$$($(PY) -c 'import llvmlite.binding as l; f = l.get_host_cpu_features(); print(int(f.get("avx2", False) and f.get("fma", False)))' 2>/dev/null); \
	avx512=$$($(PY) -c 'import llvmlite.binding as l; print(int(l.get_host_cpu_features().get("avx512f", False)))' 2>/dev/null); \
	blas=$${OPENBLAS_CORETYPE:-$$( [ "$$avx2" = 1 ] && echo Haswell )}; \
	legs=; \
	for cpu in $(PORTABLE_CPUS); do \
	  if [ $$cpu = haswell ] && [ "$$avx2" != 1 ]; then echo "test-portable: skipping haswell, this CPU lacks AVX2/FMA"; continue; fi; \
	  if [ $$cpu = haswell ] && [ "$$avx512" != 1 ] && [ -z "$(PORTABLE_ALL)" ]; then \
	    echo "test-portable: skipping haswell, this CPU's own target is AVX2 without AVX-512: test-solutions ran that arithmetic (PORTABLE_ALL=1 runs it)"; continue; fi; \
	  cache=build/numba-cache-$$cpu; rm -rf $$cache && mkdir -p $$cache; legs="$$legs $$cpu"; \
	  ( echo "test-portable: NUMBA_CPU_NAME=$$cpu, OPENBLAS_CORETYPE=$${blas:-unset}, 1 Numba thread"; start=$$(date +%s); \
	    $(SINGLE_THREAD) env $${blas:+OPENBLAS_CORETYPE=$$blas} NUMBA_NUM_THREADS=1 NUMBA_CPU_NAME=$$cpu NUMBA_CPU_FEATURES= \
	      NUMBA_CACHE_DIR=$$cache $(PYTEST) tests/core tests/ch08 $(PORTABLE_SKIP) -q --no-header --impl solutions \
	    && echo "test-portable: NUMBA_CPU_NAME=$$cpu passed in $$(( $$(date +%s) - start )) s" \
	    || { echo "test-portable: NUMBA_CPU_NAME=$$cpu FAILED"; exit 1; } ) > build/test-portable-$$cpu.log 2>&1 & \
	  eval "pid_$$cpu=$$!"; \
	done; \
	failed=0; \
	for cpu in $$legs; do \
	  eval "wait \$$pid_$$cpu" || failed=1; cat build/test-portable-$$cpu.log; \
	done; \
	[ $$failed = 0 ] || exit 1; \
	echo "test-portable: all passed in $$(( $$(date +%s) - total )) s"

# the untouched stubs must fail only with "not implemented"
check-stubs: setup
	$(SINGLE_THREAD) $(PYTEST) tests -q --no-header --impl learner --expect-stubs -m "not core"

# inside `make test`, the notebooks' run_tests("N.M") cells say so instead of running the exercise
# tests a second time (test-solutions runs them all on the solutions): NBVAL_RUN_TESTS=elsewhere.
# Chapter 2's section 2.6 runs on llama.cpp's vocab files (without them its cells only say they are
# skipped, and their checked outputs would differ): fetch-vocab first
nbval: fetch fetch-vocab
	LLMRS_IMPL=solutions $(if $(NBVAL_RUN_TESTS),LLMRS_RUN_TESTS=$(NBVAL_RUN_TESTS)) $(SINGLE_THREAD) $(PYTEST) chapters --nbval-lax --nbval-current-env \
	  --nbval-cell-timeout=$(NBVAL_TIMEOUT) --nbval-sanitize-with tests/nbval_sanitize.cfg \
	  -q --no-header

# The stored outputs that come from the engine's arithmetic, checked on another CPU's: the notebooks below
# run as in `make nbval`, with Numba compiling for haswell (AVX2 + FMA, 8 lanes; NUMBA_CPU_FEATURES empty,
# as in test-portable) into a fresh cache (an absolute path: each notebook runs in its own folder) and
# OpenBLAS on its Haswell kernels (unless the environment chose a core type). On an AVX-512 machine that
# is an AVX2 machine's arithmetic, so a checked output that holds only where it was stored fails here; on
# an AVX2 machine it is `make nbval` on these notebooks. Run it whenever a notebook changed (README,
# "Notebook outputs"). 849 s on 2 AVX2 cores shared with other work.
# Chosen: the chapters whose checked cells compare or print what SmolLM2 or a tiny model computes (3-11:
# the NumPy and Numba backends, BLAS, the int8 path, TP/PP, the CUDA simulator against NumPy; appendix B:
# every family's tiny model against transformers, on NumPy and BLAS). Left out:
# chapters 0-2 and 12, appendix A and the conclusion, whose checked cells print configurations, shapes,
# the tokenizer's ids, counts, HTTP exchanges with ignore_eos, and stored runs: no float arithmetic.
NBVAL_PORTABLE_NOTEBOOKS := $(foreach c,ch03_attention ch04_inference_loop ch05_kv_cache ch06_quantization \
                              ch07_batching ch08_cpu_optimization ch09_gpu ch10_model_formats ch11_distributed_serving \
                              appendix_b_model_families,\
                              chapters/$(c)/$(c).ipynb)
.PHONY: nbval-portable
nbval-portable: fetch
	@avx2=$$($(PY) -c 'import llvmlite.binding as l; f = l.get_host_cpu_features(); print(int(f.get("avx2", False) and f.get("fma", False)))' 2>/dev/null); \
	if [ "$$avx2" != 1 ]; then echo "nbval-portable: skipped, this CPU lacks AVX2/FMA (Numba cannot run haswell code here)"; exit 0; fi; \
	cache=$(CURDIR)/build/numba-cache-nbval-haswell; rm -rf $$cache && mkdir -p $$cache; \
	echo "nbval-portable: NUMBA_CPU_NAME=haswell, OPENBLAS_CORETYPE=$${OPENBLAS_CORETYPE:-Haswell}, fresh cache $$cache"; \
	start=$$(date +%s); \
	LLMRS_IMPL=solutions LLMRS_RUN_TESTS=$(or $(NBVAL_RUN_TESTS),elsewhere) $(SINGLE_THREAD) \
	  OPENBLAS_CORETYPE=$${OPENBLAS_CORETYPE:-Haswell} NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES= NUMBA_CACHE_DIR=$$cache \
	  $(PYTEST) $(NBVAL_PORTABLE_NOTEBOOKS) --nbval-lax --nbval-current-env \
	  --nbval-cell-timeout=$(NBVAL_TIMEOUT) --nbval-sanitize-with tests/nbval_sanitize.cfg -q --no-header || exit 1; \
	echo "nbval-portable: passed in $$(( $$(date +%s) - start )) s"

# prompt processing / generation speed, llama-bench style, with llama.cpp's in the same run
# when llama-cpp-python is installed (`.venv/bin/pip install llama-cpp-python`: a 5-minute build);
# THREADS=N sets the threads of every engine (default 2); results also go to build/bench_speed.json
bench: fetch
	@mkdir -p build
	$(VENV)/bin/llmrs bench speed --backend numba,numpy --threads $(or $(THREADS),2) --output build/bench_speed.json

# every headline benchmark of the workbook in one run (appendix A): median and bootstrap 95% interval of
# 5 repetitions each, the machine and software recorded; QUICK=1 for the small plan (about 5 minutes on
# 2 cores; the full one takes under 30); THREADS=N (default 2). Writes build/bench/results.json,
# report.md and plots. Compare two runs: .venv/bin/llmrs bench compare OLD.json NEW.json
bench-all: fetch
	$(VENV)/bin/llmrs bench all $(if $(QUICK),--quick) --threads $(or $(THREADS),2) --output-dir build/bench

# offline serving throughput of the continuous-batching engine (chapter 7)
bench-throughput: fetch
	$(VENV)/bin/llmrs bench throughput

# the serving benchmark (chapter 11, vLLM's method): our server and llama-cpp-python's, started on
# 127.0.0.1, the same GGUF and threads, at 1, 4 and 16 concurrent clients; llama-cpp-python's is
# skipped, saying so, unless `.venv/bin/pip install 'llama-cpp-python[server]'` (a 5-minute build);
# THREADS=N (default 2); results go to build/bench_serve.json and build/bench_serve.png
bench-serve: fetch
	@mkdir -p build
	$(VENV)/bin/llmrs bench serve --compare --threads $(or $(THREADS),2) --max-concurrency 1,4,16 \
	  --output build/bench_serve.json --plot build/bench_serve.png

# -- production (chapter 12): each takes minutes, none is part of `make test` ----------------
# Missing Debian packages (prometheus, buildah, podman, mmdebstrap) are installed when run as
# root; anyone else is told what to install (deploy/need.sh).

# llmrs serve on SmolLM2 and a real Prometheus (1 s scrapes), both on 127.0.0.1 and free ports;
# 8 chat completions; Prometheus's query API must agree with the responses' usage
observe: fetch
	@deploy/need.sh prometheus:prometheus
	@start=$$(date +%s); $(SINGLE_THREAD) $(PY) -m llmrs_core.ops.observe; rc=$$?; \
	echo "make observe: $$(( $$(date +%s) - start )) s"; exit $$rc

# the image, with SmolLM2 baked in (TARGET=runtime: without; BASE=python:3.12-slim where a
# registry is reachable; IMAGE=name:tag); docker when its daemon answers, else buildah
container: fetch
	@IMAGE=$(or $(IMAGE),localhost/llmrs:latest) PY=$(PY) deploy/build.sh

# run the image's entrypoint with buildah (chroot isolation, the host's network) and check /health,
# a chat completion through the openai client, and a non-root process; the container is always removed
container-test: setup
	@deploy/need.sh buildah:buildah
	@$(PY) deploy/container_test.py $(or $(IMAGE),localhost/llmrs:latest)

# Exercise 12.6: chapters/ch12_production/Dockerfile built on that image with your exercises.py
# (IMPL=solutions: ours) and run with buildah: a bad environment must stop it, a good one serve
container-test-learner: setup
	@deploy/need.sh buildah:buildah
	@LLMRS_CONTAINER_TESTS=1 LLMRS_IMAGE=$(or $(IMAGE),localhost/llmrs:latest) $(PYTEST) \
	  tests/ch12/test_ex12_6_container.py -q --no-header --tb=short --impl $(IMPL)

# encode speed of our tokenizer against Hugging Face tokenizers (chapter 2)
bench-tokenizer: fetch
	$(PY) -m llmrs_core.bench.tokenizer

# re-run every notebook in place so stored outputs and plots match the code
notebooks: fetch fetch-vocab
	$(SINGLE_THREAD) $(PY) scripts/refresh_notebooks.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
