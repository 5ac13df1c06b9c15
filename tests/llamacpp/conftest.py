"""Fixtures for the llama.cpp backend tests: the embedded SmolLM2 GGUF, loaded once per module."""

from __future__ import annotations

import pytest
from ruvllm import LLM
from ruvllm.registry import embedded_model_path

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
pytest.importorskip("ruvllm_llamacpp", reason="the ruvllm-llamacpp plugin is not installed")

#: Small enough to keep KV allocation cheap, large enough for every prompt used here.
TEST_CTX = 1024
#: One thread: on the shared 2-core test machine OpenMP's spinning threads crawl when the
#: other core is busy. Thread count does not change llama.cpp's results.
TEST_THREADS = 1


@pytest.fixture(scope="module")
def test_options() -> dict:
    """Options every test backend is loaded with."""
    return {"n_ctx": TEST_CTX, "n_threads": TEST_THREADS}


@pytest.fixture(scope="module")
def model_path():
    return embedded_model_path()


@pytest.fixture(scope="module")
def llm(test_options):
    with LLM(backend="llamacpp", options=test_options) as instance:
        yield instance


@pytest.fixture(autouse=True)
def llamacpp_isolation_bounds(cpu_isolation_bounds) -> None:
    """The isolation rule's bounds for llama.cpp on this CPU, as its conformance run has them."""
    cpu_isolation_bounds("llamacpp")
