# inferwire developer entry points. Two matter on a fresh machine:
#   make serve   set up a virtualenv and serve the bundled model on :50051
#   make test    set up, then lint, check generated code, and run the tests
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BUF := node_modules/.bin/buf
export INFERWIRE_PYTHON := $(abspath $(BIN)/python)

.PHONY: setup serve test lint generate check-generated pytest bench clean

setup: $(STAMP) $(BUF)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

$(BUF): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

serve: $(STAMP)
	$(BIN)/inferwire serve $(ARGS)

lint: setup
	$(BUF) lint
	$(BIN)/ruff check server tests scripts bench
	$(BIN)/ruff format --check server tests scripts bench

generate: setup
	scripts/generate.sh

# Regenerate and fail if anything under the generated tree changed or appeared.
check-generated: generate
	@changes="$$(git status --porcelain -- server/inferwire/v1)"; \
	if [ -n "$$changes" ]; then \
		echo "generated code is stale; run 'make generate' and commit:"; \
		echo "$$changes"; git --no-pager diff --stat -- server/inferwire/v1; exit 1; \
	fi

pytest: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test: lint check-generated pytest

bench: $(STAMP)
	$(BIN)/python bench/stream_throughput.py
	$(BIN)/python bench/startup_time.py

clean:
	rm -rf $(VENV) node_modules .pytest_cache .ruff_cache
