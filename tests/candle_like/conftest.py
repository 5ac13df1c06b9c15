"""Shared, session-scoped fixtures: loading the embedded model takes seconds, so each
configuration is loaded once for the whole candle_like test run."""

from __future__ import annotations

import contextlib

import pytest
from ruvllm.models import ModelSource
from ruvllm.registry import embedded_model_path


def llama_cpp_or_skip():
    try:
        import llama_cpp
    except ImportError as exc:  # the wheel is compiled during set-up; it may not be there yet
        pytest.skip(f"llama-cpp-python is not importable ({exc}); reference comparison skipped")
    return llama_cpp


@contextlib.contextmanager
def pytorch_layers(model):
    """``model``'s layers op by op on PyTorch meanwhile, not on the native decoder (which reads
    the weights it was built from: a test that swaps a projection must not let it run)."""
    saved = model.native
    model.native = None
    try:
        yield
    finally:
        model.native = saved


@pytest.fixture(scope="session")
def embedded_source() -> ModelSource:
    return ModelSource.from_path(embedded_model_path())


#: float32 end to end: the block kernel on float32 activations, whatever the CPU. With int8
#: activations (the default wherever the block kernel runs) a rounding difference between two
#: paths can move a code by one step, so comparisons of paths at float32's tolerances take these
#: options; test_blockmm.py (the products) and test_reference.py (parity with llama.cpp) cover the
#: int8 default by their own rules.
FP32 = {"dtype": "float32", "int8_activations": False}


@pytest.fixture(scope="session")
def backend_fp32(embedded_source):
    from ruvllm_candle_like.backend import CandleLikeBackend

    b = CandleLikeBackend.load(embedded_source, FP32)
    yield b
    b.close()


@pytest.fixture(scope="session")
def reference_llama(embedded_source):
    llama_cpp = llama_cpp_or_skip()
    ll = llama_cpp.Llama(str(embedded_source.path), n_ctx=1024, logits_all=True, verbose=False, seed=0)
    yield ll
    ll.close()
