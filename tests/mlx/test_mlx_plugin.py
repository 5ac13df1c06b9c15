"""Discovery, capabilities, options and model info of the mlx backend."""

from __future__ import annotations

import pytest
from ruvllm.errors import BackendOptionError, ConfigError
from ruvllm.models import ModelSource
from ruvllm.options import parse_options
from ruvllm.plugins import load_registry
from ruvllm_mlx.backend import MlxBackend
from ruvllm_mlx.options import MlxOptions


def test_entry_point_registers_backend():
    registry = load_registry()
    assert registry.backends.get("mlx") is MlxBackend, registry.failures
    assert registry.providers["mlx"] == "ruvllm-mlx"
    assert MlxBackend.unavailable_reason() is None


def test_capabilities_state_device_and_why():
    from ruvllm_mlx.mlx_core import mx

    caps = MlxBackend.capabilities()
    assert caps.executor and caps.core_sampler and caps.logprobs
    if mx.metal.is_available():
        assert caps.device == "metal"
    else:
        assert caps.device == "cpu"
        assert any("Metal unavailable" in note for note in caps.notes)


@pytest.mark.parametrize(
    ("options", "field", "hint"),
    [({"weights": "int3"}, "weights", "one of auto, quantized, dequantized"),
     ({"kv_bits": 5}, "kv_bits", "one of 4, 8"),
     ({"n_threads": 2}, "n_threads", "known options: compile, context_length, dtype"),
     ({"context_length": 0}, "context_length", "integer >= 1, or left unset"),
     ({"compile": 1}, "compile", "true or false")],
)
def test_bad_options_name_the_field(options, field, hint):
    with pytest.raises(BackendOptionError) as err:
        parse_options(MlxOptions, "mlx", options)
    assert (err.value.backend, err.value.option) == ("mlx", field)
    assert f"backends.mlx.{field}: " in str(err.value) and hint in str(err.value)


def test_bad_option_fails_before_loading(model_path):
    with pytest.raises(ConfigError, match=r"backends\.mlx\.kv_cache: must be one of float, quantized"):
        MlxBackend.load(ModelSource.from_path(model_path), {"kv_cache": "int4"})


def test_device_defaults():
    opts = MlxOptions()
    assert opts.resolved_weights(metal=True) == "quantized"
    assert opts.resolved_weights(metal=False) == "dequantized"
    assert opts.resolved_dtype(metal=False) == "float32"
    assert MlxOptions(weights="quantized").resolved_weights(metal=False) == "quantized"


def test_model_info_from_gguf(backend):
    info = backend.info
    assert info.architecture == "llama"
    assert info.vocab_size == 49152
    assert info.context_length == 2048  # capped by the context_length option
    assert info.special_tokens.eos_ids == (2,)
    assert info.special_tokens.eos_text == "<|im_end|>"
    assert "<|im_start|>" in info.chat_template
    assert info.quantization.startswith("q4+q8")
    assert backend.model.config.rope_traditional  # GGUF Llama q/k rows are permuted


def test_unsupported_file_is_a_load_error(tmp_path):
    from ruvllm.errors import ModelLoadError

    bogus = tmp_path / "x.gguf"
    bogus.write_bytes(b"not a gguf file")
    with pytest.raises(ModelLoadError, match=r"x\.gguf"):
        MlxBackend.load(ModelSource.from_path(bogus), {})
