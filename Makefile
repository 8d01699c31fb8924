# One command surface. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-12)
# A second checkout's ports (scripts/ports-env.sh OFFSET writes it): every target uses them.
-include .ports.env

.PHONY: help setup up down status demo lint format typecheck compat check test test-unit test-integration test-chaos test-fuzz test-security test-tls bench clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	rm -f $(VENV)/.installed-* && touch $@

setup: $(STAMP) ## Debian packages, virtualenv and Python dependencies (idempotent)

up: setup ## Start the local stack (Kafka, Connect+Debezium, PostgreSQL, Redis, SMTP sink, tax) and provision it
	$(BIN)/invoicing stack up

down: ## Stop the local stack (data is kept; `invoicing stack down --wipe` deletes it)
	@if [ -x $(BIN)/invoicing ]; then $(BIN)/invoicing stack down; fi

status: ## Show each service with port, pid and health
	$(BIN)/invoicing stack status

demo: up ## The demos: the FOCUS sample (pre-priced), the pricing scenario (price book, metered usage), an invoice's life (credit note, void), drafts (grace period, finalisation)
	$(BIN)/invoicing demo --scenario focus
	$(BIN)/invoicing demo --scenario pricing
	$(BIN)/invoicing demo --scenario lifecycle
	$(BIN)/invoicing demo --scenario drafts

lint: setup ## ruff lint and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup ## Apply ruff formatting and safe fixes
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: setup ## mypy --strict on the package and its tests
	$(BIN)/mypy

compat: setup ## Refuse schema changes that break consumers (vs every committed version of schemas/)
	$(BIN)/invoicing schemas check-compat $(COMPAT_ARGS)

test-unit: setup ## Unit tests only (no services)
	$(BIN)/pytest tests/unit

test-integration: up ## Integration tests against the real local stack (parallel, then the serial ones)
	$(BIN)/pytest tests/integration -m "not serial" -n $(INTEGRATION_WORKERS) --dist loadgroup
	$(BIN)/pytest tests/integration -m serial

test-chaos: up ## Fault-injection tests against the real local stack
	$(BIN)/pytest tests/chaos

test-security: up ## Security tier: one test per finding of docs/security.md
	$(BIN)/pytest tests/security

test-fuzz: up ## Fuzz tier: generated records to real consumers (~4 min; FUZZ_ARGS="--seed N" replays a run)
	$(BIN)/pytest tests/fuzz -s $(FUZZ_ARGS)

test-tls: setup ## The TLS profile (wipes the stack's data): stack up --profile tls, the FOCUS demo and a worker killed mid-close over TLS (tests/tls), stack down --wipe
	$(BIN)/invoicing stack down --wipe
	$(BIN)/invoicing stack up --profile tls
	set -a && source .local/conf/tls/tls.env && set +a && timeout -k 30 1200 $(BIN)/pytest tests/tls -m tls -v; rc=$$?; \
	  $(BIN)/invoicing stack down --wipe; exit $$rc

check: lint typecheck ## The inner loop (no services, about 2 min): lint, types, unit tests
	$(BIN)/pytest tests/unit -n 2 -q

INTEGRATION_WORKERS ?= 3
test: up ## Everything CI runs: lint, types, schema compatibility, unit, security, integration, fuzz, chaos (scripts/test-tiers.sh)
	INTEGRATION_WORKERS=$(INTEGRATION_WORKERS) bash scripts/test-tiers.sh

SET ?= smoke
bench: up ## Benchmarks against same-run baselines: make bench SET=smoke|standard|month-end|incident [BENCH_ARGS="--repeat 2 --profile"]
	$(BIN)/python -m benchmarks run --set $(SET) $(BENCH_ARGS)

clean: down ## Stop the stack and delete its data (keeps downloaded jars)
	$(BIN)/invoicing stack down --wipe
