"""Tiny random Llama, Mistral and Qwen2 models written in GGUF (with llama.cpp's q/k
permutation applied) and in HF form load to identical logits; the F32 GGUF also agrees with
llama.cpp itself, which proves the permutation convention rather than just self-consistency."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ruvllm.models import ModelSource
from ruvllm_candle_like.backend import CandleLikeBackend

from .conftest import llama_cpp_or_skip
from .tiny import write_tiny

KINDS = ["llama", "mistral", "qwen2"]
IDS = [1, 40, 77, 90, 200, 5, 12, 260, 261, 99, 101, 3]


def _logits(backend: CandleLikeBackend, ids: list[int]) -> np.ndarray:
    cache = backend.new_cache(len(ids))
    cache.begin(len(ids))
    with torch.inference_mode():
        out = backend.model.forward(torch.tensor(ids), torch.arange(len(ids)), cache)
    return out.numpy()


@pytest.fixture(scope="module", params=KINDS)
def tiny(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"tiny-{request.param}")
    gguf_path, hf_dir, cfg = write_tiny(request.param, root, seed=KINDS.index(request.param))
    opts = {"dtype": "float32", "kv_dtype": "float32"}
    from_gguf = CandleLikeBackend.load(ModelSource.from_path(gguf_path), opts)
    from_hf = CandleLikeBackend.load(ModelSource.from_path(hf_dir), opts)
    return request.param, gguf_path, cfg, from_gguf, from_hf


def test_gguf_and_hf_forms_give_identical_logits(tiny):
    kind, _, cfg, from_gguf, from_hf = tiny
    assert from_hf.info.architecture == kind
    a, b = _logits(from_gguf, IDS), _logits(from_hf, IDS)
    assert a.shape == (len(IDS), cfg.vocab_size)
    assert np.abs(a).max() > 0.1  # a real signal, not zeros
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_loading_undoes_the_permutation(tiny):
    """Writing permuted rows and loading them back gives the HF rows, bit for bit."""
    _, _, _, from_gguf, from_hf = tiny
    for la, lb in zip(from_gguf.model.layers, from_hf.model.layers, strict=True):
        assert torch.equal(la.qkv.weight, lb.qkv.weight)


def test_tiny_gguf_matches_llama_cpp(tiny):
    llama_cpp = llama_cpp_or_skip()
    _, gguf_path, _, from_gguf, _ = tiny
    ll = llama_cpp.Llama(str(gguf_path), n_ctx=64, logits_all=True, verbose=False, n_threads=1)
    try:
        ll.eval(IDS)
        ref = np.array(ll.scores[: len(IDS)])
    finally:
        ll.close()
    ours = _logits(from_gguf, IDS)
    # llama.cpp keeps K/V in F16; with F32 weights nothing else is rounded differently.
    assert np.abs(ours - ref).max() < 2e-2
    assert (ours.argmax(-1) == ref.argmax(-1)).all()
