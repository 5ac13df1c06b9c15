"""Fixtures for the llama.cpp backend tests: the embedded SmolLM2 GGUF, loaded once per module."""

from __future__ import annotations

import pytest
from ruvllm import LLM
from ruvllm.registry import embedded_model_path

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
pytest.importorskip("ruvllm_llamacpp", reason="the ruvllm-llamacpp plugin is not installed")

#: Small enough to keep KV allocation cheap, large enough for every prompt used here.
TEST_CTX = 1024


@pytest.fixture(scope="module")
def test_ctx() -> int:
    return TEST_CTX


@pytest.fixture(scope="module")
def model_path():
    return embedded_model_path()


@pytest.fixture(scope="module")
def llm():
    with LLM(backend="llamacpp", options={"n_ctx": TEST_CTX}) as instance:
        yield instance
