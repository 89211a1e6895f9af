# coldbrew developer commands; `make` (or `make help`) lists them.
# Every target bootstraps .venv (a no-op when it is up to date) and, when it
# needs them, makes sure PostgreSQL and RabbitMQ are up (scripts/ensure-services).

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
# make test TESTS=tests/unit PYTEST_ARGS='-x -k lease'  (TESTS only from the command line;
# PYTEST_ARGS also from the environment)
TESTS := tests
PYTEST_ARGS ?=
# pytest-xdist processes of make test's parallel phase (0: one process); JUNIT: a junit
# XML report of both phases (both also from the environment)
TEST_WORKERS ?= 3
JUNIT ?=
BENCH_ARGS ?=
# make image-test IMAGE_TEST_ARGS=--single  (or --compose)
IMAGE_TEST_ARGS ?=
# Install the bench extra too when pyproject.toml declares one.
BENCH_EXTRAS := $(shell awk '/^\[project\.optional-dependencies\]/ {s = 1; next} /^\[/ {s = 0} \
	s && /^[[:space:]]*bench[[:space:]]*=/ {f = 1} END {print (f ? "test,bench" : "test")}' pyproject.toml)

.PHONY: help bootstrap services demo test lint alerts bench image-test cluster-up cluster-down clean

help: ## list the targets
	@echo "usage: make TARGET"
	@awk -F ':.*## ' '/^[a-z][a-z-]*:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "variables: TESTS=$(TESTS) PYTEST_ARGS='...' TEST_WORKERS=$(TEST_WORKERS) JUNIT=path BENCH_ARGS='...'"

bootstrap: ## create .venv and install coldbrew[test] (only when pyproject.toml changed)
	@scripts/bootstrap

services: ## make sure PostgreSQL and RabbitMQ are reachable (starts local ones)
	@scripts/ensure-services

demo: bootstrap services ## a self-contained tour on the local broker and database
	$(VENV)/bin/coldbrew demo

# make test runs two phases (scripts/run-tests): the tests not marked exclusive side by
# side in TEST_WORKERS pytest-xdist processes, then the exclusive ones alone; one exit
# status. JUNIT=path writes one junit report of both (what .ci/run reads).
test: bootstrap services ## run the test suite in two phases (TESTS, PYTEST_ARGS, TEST_WORKERS, JUNIT)
	@TEST_WORKERS="$(TEST_WORKERS)" JUNIT="$(JUNIT)" PY="$(PY)" scripts/run-tests $(TESTS) $(PYTEST_ARGS)

lint: bootstrap ## ruff check, mypy (strict) and the import-linter layer contracts
	@rc=0; \
	echo "$(VENV)/bin/ruff check $(wildcard src tests bench)"; \
	$(VENV)/bin/ruff check $(wildcard src tests bench) || rc=1; \
	echo "$(VENV)/bin/mypy src"; \
	$(VENV)/bin/mypy src || rc=1; \
	echo "$(VENV)/bin/lint-imports"; \
	$(VENV)/bin/lint-imports --no-cache || rc=1; \
	exit "$$rc"

alerts: ## promtool: check deploy/prometheus/alerts.yml and run its unit tests (alerts.test.yml)
	@if ! command -v promtool >/dev/null 2>&1; then \
		echo "make alerts: promtool is missing: apt-get install prometheus (.ci/run installs it)" >&2; exit 2; fi
	promtool check rules deploy/prometheus/alerts.yml
	cd deploy/prometheus && promtool test rules alerts.test.yml

bench: ## run the benchmarks (bench/run_all.py, else bench/throughput.py; BENCH_ARGS)
	@scripts/bootstrap $(BENCH_EXTRAS)
	@scripts/ensure-services
	@if [ -f bench/run_all.py ]; then script=bench/run_all.py; \
	elif [ -f bench/throughput.py ]; then script=bench/throughput.py; \
	else echo "make bench: neither bench/run_all.py nor bench/throughput.py exists" >&2; exit 2; fi; \
	echo "$(PY) $$script $(BENCH_ARGS)"; \
	$(PY) "$$script" $(BENCH_ARGS)

image-test: services ## build deploy/Dockerfile and run it in containers, then deploy/compose.yaml (podman; IMAGE_TEST_ARGS)
	scripts/image-test $(IMAGE_TEST_ARGS)

cluster-up: ## a 3-node RabbitMQ cluster (5681-5683) and a PostgreSQL primary/standby (5441/5442)
	@scripts/cluster up

cluster-down: ## stop scripts/cluster's nodes and servers and remove their directory
	@scripts/cluster down

clean: ## remove caches and build output (keeps .venv)
	rm -rf .pytest_cache .mypy_cache .ruff_cache build dist .coverage htmlcov src/*.egg-info
	find . \( -path ./.venv -o -path ./.git \) -prune -o -type d -name __pycache__ -exec rm -rf {} +
