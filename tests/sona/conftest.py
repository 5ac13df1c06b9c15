"""One candle_like backend for the SONA tests (loading takes seconds), and an engine with SONA
attached per test (no background thread unless a test starts one).

The backend takes ``dtype = "auto"``, what this CPU computes fast: float32 on the GGUF's blocks
(on int8 activations where the CPU has AVX512-VNNI), bf16 dense where bf16 is native and the
blocks cannot run. An explicit bf16 on an AVX2-only CPU made training's backward fall to torch's
single-threaded reference gemm (the SONA tests ran over 20 minutes there)."""

from __future__ import annotations

import pytest
from ruvllm.models import ModelSource
from ruvllm.registry import embedded_model_path


@pytest.fixture(scope="session")
def backend():
    from ruvllm_candle_like.backend import CandleLikeBackend

    b = CandleLikeBackend.load(ModelSource.from_path(embedded_model_path()),
                               {"dtype": "auto", "kv_cache_tokens": 4096})
    yield b
    b.close()


@pytest.fixture
def engine(backend):
    from ruvllm.engine import EngineOptions, ServingEngine

    # No prefix cache: reset-exactness compares runs whose prefill shapes must match.
    eng = ServingEngine(backend, EngineOptions(max_num_seqs=8, block_size=16, enable_prefix_caching=False))
    yield eng
    from ruvllm_sona import detach

    detach(eng)
    eng.close()
    for name in backend.adapter_names():  # leave the shared backend as the next test expects it
        backend.unload_adapter(name)


@pytest.fixture(scope="session")
def ask(backend):
    """Token ids of a one-message chat with the model's own template."""
    from ruvllm.chat import render_chat

    st = backend.info.special_tokens

    def ids(text: str) -> list[int]:
        rendered = render_chat(backend.info.chat_template, [{"role": "user", "content": text}],
                               bos_token=st.bos_text, eos_token=st.eos_text)
        return backend.tokenizer.encode(rendered, add_special=False, parse_special=True)

    return ids
