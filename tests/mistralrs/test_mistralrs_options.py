"""Option parsing and mapping: pure logic, no engine."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import mistralrs
import pytest
from ruvllm.errors import BackendOptionError, BackendUnavailable, InvalidRequest
from ruvllm.models import ModelSource
from ruvllm.options import parse_options
from ruvllm.types import GenerationParams
from ruvllm_mistralrs import MistralRsBackend
from ruvllm_mistralrs.engine import check_paged_attention, runner_kwargs, serial_prefill
from ruvllm_mistralrs.options import MistralRsOptions
from ruvllm_mistralrs.platform import Build, installed_build
from ruvllm_mistralrs.requests import chat_request
from ruvllm_mistralrs.token_ids import TokenIdResolver

CPU = Build("mistralrs", "0.9.5", "cpu")
CUDA = Build("mistralrs-cuda", "0.9.5", "cuda")


@pytest.mark.parametrize(("options", "field", "hint"), [
    ({"max_seqs": 0}, "max_seqs", "integer >= 1"),
    ({"isq": "Q3_X"}, "isq", "one of Q4_0, Q4_1"),
    ({"dtype": "fp64"}, "dtype", "one of auto, bf16, f16, f32"),
    ({"paged_memory_goal": "lots"}, "paged_memory_goal", 'number in (0.0, 1.0] or a KV size such as "4GiB"'),
    ({"serial_prefill": "maybe"}, "serial_prefill", "one of auto, on, off"),
    ({"adapter": "missing"}, "adapter", "not in adapters (none)"),
    ({"no_such_option": 1}, "no_such_option", "known options: adapter, adapters"),
    ({"paged_attention": False, "paged_block_size": 32}, "paged_attention", "set paged_attention = true"),
    ({"xlora": {"order": "x.json"}}, "xlora", "model_id = \"X-LoRA checkpoint dir\""),
    ({"threads": True}, "threads", "integer >= 1, or left unset"),
])
def test_bad_options_name_the_field(options, field, hint):
    with pytest.raises(BackendOptionError) as err:
        parse_options(MistralRsOptions, "mistralrs", options)
    assert (err.value.backend, err.value.option) == ("mistralrs", field)
    assert f"backends.mistralrs.{field}: " in str(err.value) and hint in str(err.value)


def test_isq_names_are_normalised():
    assert parse_options(MistralRsOptions, "mistralrs", {"isq": "q4k"}).isq == "Q4K"


@pytest.mark.parametrize("options", [{"paged_attention": True}, {"paged_block_size": 32},
                                     {"paged_memory_goal": "2GiB"}, {"paged_cache_type": "f8e4m3"}])
def test_paged_attention_demanded_on_cpu_fails_naming_the_option(options):
    opts = parse_options(MistralRsOptions, "mistralrs", options)
    with pytest.raises(BackendUnavailable) as err:
        check_paged_attention(opts, CPU)
    assert next(iter(options)) in str(err.value) and "CUDA and Metal" in str(err.value)
    check_paged_attention(opts, CUDA)  # the GPU builds accept it


def test_paged_attention_fails_at_load_before_reading_weights(tmp_path):
    if installed_build().paged_kernels:
        pytest.skip("this mistral.rs build has PagedAttention kernels")
    missing = ModelSource(name="nothing", path=tmp_path / "absent.gguf", format="gguf")
    with pytest.raises(BackendUnavailable, match="paged_attention"):
        MistralRsBackend.load(missing, {"paged_attention": True})


def test_capabilities_on_this_build():
    caps = MistralRsBackend.capabilities()
    assert caps.core_sampler is False and caps.executor is False and caps.logprobs is True
    # Before a load nothing runs anywhere: PagedAttention is claimed only by a loaded backend
    # whose model mistral.rs placed on a GPU (tests/mistralrs/test_mistralrs_runtime.py).
    assert caps.paged_attention is False
    assert any("PagedAttention" in note for note in caps.notes)


def test_paged_options_map_to_runner_arguments_on_gpu_builds(tmp_path):
    opts = parse_options(MistralRsOptions, "mistralrs", {
        "paged_attention": True, "paged_block_size": 16, "paged_memory_goal": 0.5,
        "paged_cache_type": "f8e4m3", "prefix_cache_size": 4, "max_seqs": 3,
    })
    # The CPU wheel does not export PagedCacheType; stand in for a GPU build's module.
    gpu_module = SimpleNamespace(PagedCacheType=SimpleNamespace(Auto="auto", F8E4M3="f8e4m3"))
    kw = runner_kwargs(gpu_module, opts, CUDA, tmp_path / "t.jinja", isq=None)
    assert kw["paged_attn"] is True and kw["pa_blk_size"] == 16 and kw["memory_goal"] == 0.5
    assert kw["pa_cache_type"] == "f8e4m3"
    assert kw["prefix_cache_n"] == 4 and kw["max_seqs"] == 3
    cpu = runner_kwargs(mistralrs, MistralRsOptions(), CPU, tmp_path / "t.jinja", isq=None)
    assert not {"paged_attn", "pa_blk_size", "memory_goal", "pa_cache_type"} & set(cpu)


def test_serial_prefill_is_on_for_quantized_weights():
    gguf = ModelSource(name="m", path=Path("/m.gguf"), format="gguf")
    hf = ModelSource(name="m", path=Path("/m"), format="hf")
    assert serial_prefill(MistralRsOptions(), gguf, isq=None)
    assert serial_prefill(MistralRsOptions(), hf, isq="Q4K")
    assert not serial_prefill(MistralRsOptions(), hf, isq=None)
    assert serial_prefill(MistralRsOptions(serial_prefill="on"), hf, isq=None)


def test_request_mapping():
    params = GenerationParams(max_tokens=7, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05,
                              repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=0.3,
                              logprobs=3, stop=["x"])
    # The binding's request objects hide their fields; capture the keyword arguments instead.
    capture = SimpleNamespace(ChatCompletionRequest=lambda **kw: kw)
    req = chat_request(capture, "hi", params, adapter="a", banned=[0, 1])
    sampling = ("max_tokens", "temperature", "top_p", "top_k", "min_p")
    assert [req[k] for k in sampling] == [7, 0.7, 0.9, 40, 0.05]
    penalties = ("repetition_penalty", "frequency_penalty", "presence_penalty")
    assert [req[k] for k in penalties] == [1.1, 0.2, 0.3]
    assert req["top_logprobs"] == 3 and req["logprobs"] is True and req["adapter"] == "a"
    assert "stop_seqs" not in req  # core matches stop strings
    assert req["logit_bias"] == {0: float("-inf"), 1: float("-inf")}
    assert req["messages"] == [{"role": "user", "content": "hi"}] and req["ignore_eos"] is False
    mistralrs.ChatCompletionRequest(**req)  # and the real binding accepts exactly these


def test_seeded_sampling_is_refused_with_the_reason():
    with pytest.raises(InvalidRequest) as err:
        chat_request(mistralrs, "hi", GenerationParams(temperature=0.8, seed=3), adapter=None)
    assert err.value.field == "seed"
    chat_request(mistralrs, "hi", GenerationParams(temperature=0.0, seed=3), adapter=None)  # greedy: fine


def test_llama_cpps_sampler_order_is_refused_with_the_reason():
    """mistral.rs applies the temperature first, inside its engine: llama.cpp's order is refused."""
    with pytest.raises(InvalidRequest, match="its own order") as err:
        chat_request(mistralrs, "hi", GenerationParams(temperature=0.8, temperature_last=True), adapter=None)
    assert err.value.field == "temperature_last"
    chat_request(mistralrs, "hi", GenerationParams(temperature=0.0, temperature_last=True), adapter=None)


def test_min_tokens_is_refused_with_the_reason():
    """mistral.rs samples by itself and has no minimum length: refused, not ignored."""
    with pytest.raises(InvalidRequest, match="no minimum length") as err:
        chat_request(mistralrs, "hi", GenerationParams(min_tokens=2), adapter=None)
    assert err.value.field == "min_tokens"


def test_token_id_resolver():
    resolver = TokenIdResolver([b"a", b"b", b"<s>", b"<s>"])
    assert resolver.resolve(b"b", -0.5, []) == 1
    assert resolver.resolve(b"<s>", -0.25, [(3, -0.25), (1, -1.0)]) == 3
    from ruvllm.errors import BackendError

    with pytest.raises(BackendError):
        resolver.resolve(b"<s>", -0.25, [(1, -0.25)])
    with pytest.raises(BackendError):
        resolver.resolve(b"zz", -0.1, [])
