"""Fixtures for the mistral.rs backend tests: the embedded GGUF, its Hugging Face conversion
(through candle_like's ``gguf_to_hf``, i.e. ``ruvllm convert``), small real PEFT adapters and an
X-LoRA checkpoint built from them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from ruvllm.models import ModelSource
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
def hf_source(hf_dir):
    return ModelSource.from_path(hf_dir)


@pytest.fixture(scope="module")
def lora_backend(hf_source):
    """The converted model with an empty dynamic-LoRA runtime: base output until adapters load.

    Module-scoped, not session-scoped: it holds about 0.7 GB of anonymous memory, and mistral.rs
    refuses to load a model when its estimate exceeds the machine's *available* memory at that
    moment ("This model does not fit on the devices"). Kept for the whole session, it was still
    resident when test_mistralrs_xlora.py loaded its X-LoRA models, which made those two tests the
    memory peaks of the run and the first to fail when the rest of the suite (or other processes)
    had used up free memory; alone they passed."""
    backend = MistralRsBackend.load(hf_source, {"lora": True, "threads": 1, "max_seqs": 4})
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def hf_untied_dir(hf_dir, tmp_path_factory) -> Path:
    """The converted model with its tied lm_head stored as its own tensor (same values), which
    mistral.rs's X-LoRA models read. The original shard is linked, not copied."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    dst = tmp_path_factory.mktemp("smollm2-hf-untied")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (dst / name).symlink_to(hf_dir / name)
    config = json.loads((hf_dir / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    (dst / "model-00001-of-00002.safetensors").symlink_to(hf_dir / "model.safetensors")
    with safe_open(str(hf_dir / "model.safetensors"), framework="np") as st:
        lm_head = st.get_tensor("model.embed_tokens.weight")
    save_file({"lm_head.weight": lm_head}, str(dst / "model-00002-of-00002.safetensors"))
    return dst


def write_xlora_checkpoint(dst: Path, *, names=("math", "poetry"), seed: int = 20) -> Path:
    """An X-LoRA checkpoint in PEFT's layout: one real LoRA sub-directory per adapter, and a
    trained-shape classifier (depth 1: one linear layer hidden -> adapters, with bias) whose
    non-zero weights favour the first adapter."""
    from safetensors.numpy import save_file

    dst.mkdir(parents=True, exist_ok=True)
    for k, name in enumerate(names):
        write_peft_adapter(dst / name, seed=seed + k)
    rng = np.random.default_rng(seed)
    bias = np.linspace(1.0, -1.0, len(names)).astype(np.float32)
    save_file({"last.weight": (rng.standard_normal((len(names), HIDDEN)) * 0.05).astype(np.float32),
               "last.bias": bias}, str(dst / "xlora_classifier.safetensors"))
    (dst / "xlora_config.json").write_text(json.dumps({
        "hidden_size": HIDDEN, "base_model_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "adapters": {name: f"./{name}" for name in names}, "xlora_depth": 1, "layerwise_scalings": False,
        "enable_softmax": True, "softmax_temperature": 1.0, "use_bias": True, "scaling_pass_value": 0.0,
        "global_scaling_weight": 1.0, "peft_type": "XLORA", "task_type": "CAUSAL_LM",
    }))
    return dst


@pytest.fixture(scope="session")
def make_xlora_checkpoint():
    """``make_xlora_checkpoint(dir, names=(...))`` writes an X-LoRA checkpoint for the embedded model."""
    return write_xlora_checkpoint


@pytest.fixture(scope="session")
def xlora_checkpoint(tmp_path_factory) -> Path:
    return write_xlora_checkpoint(tmp_path_factory.mktemp("xlora") / "ckpt")


@pytest.fixture(scope="session")
def make_adapter():
    """``make_adapter(dir, seed=N)`` writes a PEFT LoRA adapter for the embedded model."""
    return write_peft_adapter
