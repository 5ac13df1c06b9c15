"""Fixtures for the mistral.rs backend tests: the embedded GGUF, its Hugging Face conversion
(through candle_like's ``gguf_to_hf``, i.e. ``ruvllm convert``) and a small real PEFT adapter."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from ruvllm.registry import resolve

pytest.importorskip("mistralrs", reason="mistral.rs (pip install mistralrs) is not installed")
pytest.importorskip("ruvllm_mistralrs", reason="the ruvllm-mistralrs plugin is not installed")

from ruvllm_mistralrs import MistralRsBackend

# SmolLM2-135M shapes: hidden 576, 9 query heads and 3 KV heads of 64, 30 layers.
HIDDEN, Q_OUT, V_OUT, LAYERS = 576, 576, 192, 30


@pytest.fixture(scope="session")
def embedded(tmp_path_factory):
    return resolve("default", tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def gguf_backend(embedded):
    backend = MistralRsBackend.load(embedded, {"max_seqs": 8, "threads": 1})
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def hf_dir(embedded, tmp_path_factory) -> Path:
    convert = pytest.importorskip("ruvllm_candle_like.convert", reason="needs `ruvllm convert` (candle_like)")
    return convert.gguf_to_hf(embedded.path, tmp_path_factory.mktemp("smollm2-hf"), dtype="float32",
                              overwrite=True)


def write_peft_adapter(dst: Path, *, seed: int, rank: int = 8, alpha: int = 16, scale: float = 0.15) -> Path:
    """A real PEFT LoRA directory for SmolLM2-135M: random, non-zero A and B on q_proj/v_proj of
    every layer (B non-zero too, unlike a freshly initialised PEFT adapter, so it changes the
    output)."""
    from safetensors.numpy import save_file

    dst.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(LAYERS):
        for name, out in (("q_proj", Q_OUT), ("v_proj", V_OUT)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            a = rng.standard_normal((rank, HIDDEN)) * scale
            tensors[f"{prefix}.lora_A.weight"] = a.astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = (rng.standard_normal((out, rank)) * scale).astype(np.float32)
    save_file(tensors, str(dst / "adapter_model.safetensors"))
    (dst / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
        "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.0, "bias": "none",
        "fan_in_fan_out": False, "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
    }))
    return dst


@pytest.fixture(scope="session")
def make_adapter():
    """``make_adapter(dir, seed=N)`` writes a PEFT LoRA adapter for the embedded model."""
    return write_peft_adapter
