# shiplift — `make demo` and `make test` work on a fresh machine (Python 3.11, a C compiler).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# llama.cpp is compiled for the portable x86 AVX2 class, not -march=native: on a VM whose CPU reports AMX but whose
# kernel does not grant the AMX tile state, a native build dies with a general protection fault at its first
# `ldtilecfg` (seen on this project's 2-core build machine, 2026-12-03). Override for another CPU class.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
# Reinstall whenever pyproject.toml or llama.cpp's build flags change.
HASH   := $(shell (cat pyproject.toml; echo '$(LLAMA_CMAKE_ARGS)') | sha256sum | cut -c1-16)
STAMP  := $(VENV)/.installed-$(HASH)
# The celery extra (Airflow's Celery provider, celery[redis], redis, asyncpg) is installed by make test-celery alone.
CELERY_STAMP := $(VENV)/.installed-celery-$(HASH)
PYTEST_ARGS ?=
# make bench-gate BENCH_ARGS="--candidates 1000 --suggest": options of bench/gate_error_rates.py (bench-gate-wall:
# of bench/gate_wall.py, e.g. BENCH_ARGS="--tiny --rounds 2"; bench: --sections 5,9,10)
BENCH_ARGS ?=

.PHONY: setup browser demo test test-integration test-slow test-load test-celery test-aws-live lint bench bench-chat bench-ledger bench-gate bench-gate-wall airflow clean stop

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --progress-bar off --upgrade pip setuptools wheel
	@echo "installing shiplift and its pinned dependencies (llama-cpp-python compiles from source the first time: ~10 min)"
	@# llama.cpp built with other flags (or by an older Makefile) is rebuilt: pip's wheel cache does not key on CMAKE_ARGS
	@if [ "$$(cat $(VENV)/.llama-cmake-args 2>/dev/null)" != '$(LLAMA_CMAKE_ARGS)' ]; then \
	  $(BIN)/python -m pip cache remove llama_cpp_python >/dev/null 2>&1; \
	  $(BIN)/python -m pip uninstall -y -q llama-cpp-python 2>/dev/null; true; fi
	CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)' $(BIN)/python -m pip install --progress-bar off -e '.[dev,demo,airflow,encoders,openvino]'
	@echo '$(LLAMA_CMAKE_ARGS)' > $(VENV)/.llama-cmake-args
	@rm -f $(VENV)/.installed-*
	@touch $@

setup: $(STAMP)

# Into the same .venv, resolved together with dev and demo so that pip keeps their pins; the $(STAMP) rule above
# deletes this stamp with the others, so a reinstall is followed by this one again at the next make test-celery.
$(CELERY_STAMP): $(STAMP)
	@echo "installing the celery extra for make test-celery (apache-airflow-providers-celery, celery[redis], redis, asyncpg)"
	CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)' $(BIN)/python -m pip install --progress-bar off -e '.[dev,demo,airflow,encoders,openvino,celery]'
	@rm -f $(VENV)/.installed-celery-*
	@touch $@

# The browser tests render the gate reports and the audit report in Debian's headless Chromium.
CHROMIUM ?= /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
$(CHROMIUM):
	@echo "installing Debian's chromium for the audit report's browser test"
	$(SUDO) apt-get install -y --no-install-recommends chromium || { $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends chromium; }

browser: $(CHROMIUM)

demo: setup          ## set up, then run the local release story
	$(BIN)/python -m shiplift.tasks.cli.demo

test: setup lint browser  ## set up, then run the default test suite (under 20 minutes; the integration suites apart)
	$(BIN)/python -m pytest -m "not integration and not slow and not celery and not load and not live and not own_process" $(PYTEST_ARGS)
	$(BIN)/python -m pytest -m "own_process and not integration and not slow and not celery and not load and not live" $(PYTEST_ARGS)

test-integration: setup  ## whole releases on the local backend and the AWS double, Airflow dag.test() runs (tests/e2e, tests/aws, tests/dags); .ci/run runs it after make test
	$(BIN)/python -m pytest -m "integration and not slow and not celery and not load and not live and not own_process" $(PYTEST_ARGS)

lint: setup          ## ruff with the rules in pyproject.toml: pyflakes, pycodestyle at 120 columns, import order and placement, bugbear, complexity 10
	$(BIN)/ruff check tasks validation dags images bench scripts tests

test-slow: setup     ## the slow suites: the real Gemma model, the end-to-end canaries with live traffic (local and the aws double)
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

test-load: setup     ## the long load tests: a rolling update under 16 clients and 2,000 requests from a second process
	$(BIN)/python -m pytest -m load -s $(PYTEST_ARGS)

test-celery: setup $(CELERY_STAMP)  ## installs the celery extra, then the refresh DAG on Airflow's CeleryExecutor + PostgreSQL + Redis on loopback
	PYTHON=$(BIN)/python scripts/airflow_celery_test.sh $(PYTEST_ARGS)

test-aws-live: setup ## releases a tiny CPU canary into your AWS account and deletes it again; costs money: prints its estimate, runs with PYTEST_ARGS=--yes or SHIPLIFT_LIVE_OK=1
	$(BIN)/python -m pytest -m live tests/live -s $(PYTEST_ARGS)

airflow: setup       ## local Airflow (SQLite) with this checkout's DAGs on 127.0.0.1; prints the admin login; Ctrl-C stops
	PYTHON=$(BIN)/python scripts/airflow_standalone.sh

bench: setup         ## side-by-side speed ratios; BENCH_ARGS="--sections 5,9,10" measures those sections alone, in one run
	$(BIN)/python -m bench.run $(BENCH_ARGS)

bench-chat: setup    ## the chat-path section of `make bench` alone: SemIf vs the DLC's chat path on the same model and tasks
	$(BIN)/python -m bench.chat_path

bench-ledger: setup  ## the ledger section of `make bench` alone (no model): appends, verify, proofs at 10k and 100k records
	$(BIN)/python -m bench.ledger

bench-gate: setup    ## the gate's error rates on seeded candidates with known truth (recorded outcomes, no model): false promotions, false blocks, tasks used
	$(BIN)/python -m bench.gate_error_rates $(BENCH_ARGS)

bench-gate-wall: setup  ## section 10 of `make bench` alone: the gate's wall time with the champion's recorded results reused vs scored afresh
	$(BIN)/python -m bench.gate_wall $(BENCH_ARGS)

stop:                ## stop every local endpoint this checkout started (default and demo state)
	@for dir in .shiplift .shiplift/demo .shiplift/airflow; do \
	  if [ -d $$dir/endpoints ]; then $(BIN)/shiplift endpoints stop --all --state-dir $$dir; fi; \
	done

clean: stop
	rm -rf .shiplift
