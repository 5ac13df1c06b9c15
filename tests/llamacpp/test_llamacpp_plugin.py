"""Discovery, capabilities, option validation and load errors of the llama.cpp backend."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from ruvllm.backend import LlmBackend
from ruvllm.errors import BackendError, BackendOptionError, ConfigError, ModelLoadError
from ruvllm.hardware import usable_cpus
from ruvllm.models import ModelSource
from ruvllm.options import parse_options
from ruvllm.plugins import load_registry
from ruvllm.types import GenerationParams
from ruvllm_llamacpp import LlamaCppBackend, LlamaCppOptions


def test_plugin_is_discovered_through_its_entry_point():
    registry = load_registry()
    assert registry.backends.get("llamacpp") is LlamaCppBackend
    assert registry.providers["llamacpp"] == "ruvllm-llamacpp"
    assert not [f for f in registry.failures if f.plugin == "ruvllm-llamacpp"]


def test_available_with_version_and_honest_capabilities():
    assert LlamaCppBackend.unavailable_reason() is None
    assert LlamaCppBackend.version()
    caps = LlamaCppBackend.capabilities()
    assert caps.streaming and caps.logprobs and caps.core_sampler
    assert caps.device == "cpu"
    # The executor capability is claimed only together with a real create_executor.
    assert caps.executor is True
    assert LlamaCppBackend.create_executor is not LlmBackend.create_executor


def test_option_defaults():
    opts = parse_options(LlamaCppOptions, "llamacpp", {})
    assert (opts.n_ctx, opts.n_batch, opts.n_gpu_layers) == (0, 512, 0)  # 0: the model's context
    assert opts.n_threads == usable_cpus() >= 1
    assert opts.prefix_reuse is False and opts.verbose is False
    assert opts.kv_budget_mib == 256


SET_IT = "--option {}=VALUE"  # the fix named for a value out of range
DROP_IT = "remove it"  # the fix named for an unknown option


@pytest.mark.parametrize(
    ("options", "field", "hint", "fix"),
    [
        ({"n_ctx": "big"}, "n_ctx", "integer", SET_IT),
        ({"n_ctx": 8}, "n_ctx", "at least 16", SET_IT),
        ({"n_threads": 0}, "n_threads", ">= 1", SET_IT),
        ({"n_batch": True}, "n_batch", "integer", SET_IT),
        ({"n_batch": 2.5}, "n_batch", "integer", SET_IT),
        ({"n_gpu_layers": -2}, "n_gpu_layers", ">= -1", SET_IT),
        ({"prefix_reuse": "yes"}, "prefix_reuse", "true or false", SET_IT),
        ({"verbose": 1}, "verbose", "true or false", SET_IT),
        ({"kv_budget_mib": -1}, "kv_budget_mib", ">= 0", SET_IT),
        ({"type_k": "q5_k"}, "type_k", "one of f16, q8_0, q4_0", SET_IT),
        ({"n_ctxx": 512}, "n_ctxx", "known options: embedding_tokens, flash_attn, kv_budget_mib, n_batch",
         DROP_IT),
    ],
)
def test_bad_options_name_the_field_and_the_fix(options, field, hint, fix, model_path):
    source = ModelSource.from_path(model_path)
    with pytest.raises(BackendOptionError) as err:
        LlamaCppBackend.load(source, options)
    assert isinstance(err.value, ConfigError)
    assert (err.value.backend, err.value.option) == ("llamacpp", field)
    assert err.value.value == options[field]
    message = str(err.value)
    assert f"backends.llamacpp.{field}" in message and hint in message
    assert fix.format(field) in message


def test_garbage_file_is_a_model_load_error(tmp_path):
    bad = tmp_path / "garbage.gguf"
    bad.write_bytes(b"\x00\x13not a model at all" * 64)
    with pytest.raises(ModelLoadError) as err:
        LlamaCppBackend.load(ModelSource.from_path(bad), {})
    assert "not a GGUF file" in err.value.reason


def test_truncated_gguf_reports_llama_cpps_reason(tmp_path, model_path, capfd):
    # Right magic and header, but cut short: only llama.cpp itself can say what is wrong.
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(model_path.read_bytes()[:4096])
    with pytest.raises(ModelLoadError) as err:
        LlamaCppBackend.load(ModelSource.from_path(bad), {})
    # llama.cpp's own error lines, captured from its log (not printed: verbose is off).
    assert "failed to read key-value pairs" in err.value.reason
    assert "error loading model" in err.value.reason
    assert "error loading model" not in capfd.readouterr().err


def test_missing_file_and_wrong_format(tmp_path):
    with pytest.raises(ModelLoadError, match="is not a file"):
        LlamaCppBackend.load(ModelSource(name="x", path=tmp_path / "nope.gguf", format="gguf"), {})
    with pytest.raises(ModelLoadError, match="reads GGUF files"):
        LlamaCppBackend.load(ModelSource(name="x", path=tmp_path, format="hf"), {})


def test_context_is_capped_at_the_training_context_and_close_frees(model_path):
    backend = LlamaCppBackend.load(ModelSource.from_path(model_path), {"n_ctx": 1_000_000, "n_batch": 64})
    train = int(backend.metadata["llama.context_length"])
    assert backend.n_ctx == backend.info.context_length == train
    assert backend.n_batch == 64
    backend.close()
    assert backend.closed and backend.cached_tokens() == 0
    with pytest.raises(BackendError, match="closed"):
        backend.generate([1, 2, 3], GenerationParams(max_tokens=1))
    backend.close()  # idempotent


def test_missing_llama_cpp_is_a_reason_not_a_crash():
    # A fresh interpreter where `import llama_cpp` fails, as with no wheel or a broken build.
    code = textwrap.dedent("""
        import sys
        sys.modules["llama_cpp"] = None
        from ruvllm.errors import BackendUnavailable
        from ruvllm.plugins import load_registry
        registry = load_registry()
        cls = registry.backends["llamacpp"]
        print(cls.unavailable_reason())
        print(cls.capabilities().device)
        try:
            registry.select("llamacpp")
        except BackendUnavailable as exc:
            print("unavailable:", exc.reason == cls.unavailable_reason())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    reason, device, selected = out.stdout.strip().splitlines()
    assert "llama-cpp-python is not importable" in reason and "pip install" in reason
    assert device == "cpu"
    assert selected == "unavailable: True"
