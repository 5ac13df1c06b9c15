"""The native decoder (ruvllm_candle_like.native_decoder): the embedded model's layers in one native
call compute what the PyTorch path computes, for every kind of step the runtime makes (decode rows
and short chunks on the pool kernel, long chunks and the request-level cache through the hook,
LoRA deltas), a failing hook's error reaches the caller, and a model it cannot run is named."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ruvllm.executor import BatchEntry
from ruvllm_candle_like import native_decoder
from ruvllm_candle_like.kv_contiguous import ContiguousCache
from ruvllm_candle_like.lora import LoraPlan

from .conftest import pytorch_layers
from .test_lora import random_adapter

pytestmark = pytest.mark.skipif(isinstance(native_decoder._kernel(), str),
                                reason=str(native_decoder._kernel()))

#: Largest logit difference allowed against the PyTorch path. The two sum in other orders (RMSNorm,
#: the exp of SiLU): 0.006 measured on logits of |25| over these steps. A KV leak, a wrong RoPE
#: position or a dropped hook moves logits by whole units.
ATOL = 0.03


def _executor_logits(backend, ids) -> list[np.ndarray]:
    """A long prompt (native rows left to SDPA through the hook) beside a short one, then decode
    steps of both."""
    ex = backend.create_executor(max_sequences=2, block_size=16)
    tables = ((0, 1, 2, 3), (4, 5, 6, 7))
    out = ex.execute([BatchEntry(seq_id=0, tokens=tuple(ids), start_pos=0, block_table=tables[0]),
                      BatchEntry(seq_id=1, tokens=tuple(ids[:10]), start_pos=0, block_table=tables[1])])
    steps = [out]
    pos = [len(ids), 10]
    for _ in range(4):
        nxt = out.argmax(-1).tolist()
        out = ex.execute([BatchEntry(seq_id=i, tokens=(nxt[i],), start_pos=pos[i], block_table=tables[i])
                          for i in range(2)])
        steps.append(out)
        pos = [p + 1 for p in pos]
    return steps


def test_the_embedded_model_runs_on_it(backend_fp32):
    assert backend_fp32.model.native is not None, backend_fp32.model.native_off
    assert "native layers" in backend_fp32.create_executor(max_sequences=1, block_size=16).describe()


def test_executor_steps_compute_what_the_pytorch_path_computes(backend_fp32):
    ids = backend_fp32.tokenizer.encode("Write a short story about a robot who learns to paint. "
                                        "Once upon a time there was")
    assert len(ids) > 16  # a chunk the native attention leaves to SDPA
    native = _executor_logits(backend_fp32, ids)
    with pytorch_layers(backend_fp32.model):
        reference = _executor_logits(backend_fp32, ids)
    for got, want in zip(native, reference, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
        assert (got.argmax(-1) == want.argmax(-1)).all()


class CountingCache:
    """The request-level cache, counting the layers it is called back for."""

    def __init__(self, model, n: int, fail_at: int | None = None):
        self.cache = ContiguousCache(model.cfg, n, kv_dtype=torch.float16, compute_dtype=model.dtype,
                                     device=model.device)
        self.cache.begin(n)
        self.calls = 0
        self.fail_at = fail_at

    def attend(self, layer, q, k, v):
        self.calls += 1
        if layer == self.fail_at:
            raise KeyError(f"no KV for layer {layer}")
        return self.cache.attend(layer, q, k, v)


def _forward(model, ids, attention, lora=None):
    with torch.inference_mode():
        return model.forward(torch.tensor(ids), torch.arange(len(ids)), attention, None, lora)


def test_other_kv_layouts_attend_through_the_hook(backend_fp32):
    model = backend_fp32.model
    ids = backend_fp32.tokenizer.encode("The capital of France is")
    counting = CountingCache(model, len(ids))
    got = _forward(model, ids, counting)
    assert counting.calls == model.cfg.num_layers
    with pytorch_layers(model):
        want = _forward(model, ids, CountingCache(model, len(ids)))
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL)


def test_a_failing_hook_raises_its_error_and_the_next_call_is_clean(backend_fp32):
    model = backend_fp32.model
    ids = backend_fp32.tokenizer.encode("The capital of France is")
    with pytest.raises(KeyError, match="no KV for layer 3"):
        _forward(model, ids, CountingCache(model, len(ids), fail_at=3))
    first = _forward(model, ids, CountingCache(model, len(ids)))
    assert torch.equal(first, _forward(model, ids, CountingCache(model, len(ids))))


def test_lora_deltas_reach_every_projection(backend_fp32):
    model = backend_fp32.model
    every = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    plan = LoraPlan([(random_adapter(backend_fp32, "t-native", seed=7, rank=2, targets=every), None)])
    ids = backend_fp32.tokenizer.encode("Once upon a time")
    base = _forward(model, ids, CountingCache(model, len(ids)))
    got = _forward(model, ids, CountingCache(model, len(ids)), plan)
    with pytorch_layers(model):
        want = _forward(model, ids, CountingCache(model, len(ids)), plan)
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL)
    assert (got - base).abs().max() > 1.0


def test_models_it_cannot_run_are_named(backend_fp32):
    model = backend_fp32.model
    assert "float32" in str(native_decoder.unavailable(model.cast(torch.bfloat16)))
    # The training copy holds its projections dense.
    assert "not on ruvllm's block kernel" in str(native_decoder.unavailable(model.cast(torch.float32)))
