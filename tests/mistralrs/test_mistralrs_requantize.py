"""``isq = "auto"``: which GGUF files a load requantizes to Q8_0, and when it keeps them."""

from __future__ import annotations

import pytest
from ruvllm.models import ModelSource
from ruvllm.options import parse_options
from ruvllm_mistralrs.options import MistralRsOptions
from ruvllm_mistralrs.platform import Build
from ruvllm_mistralrs.requantize import resolve_isq

CPU = Build("mistralrs", "0.9.5", "cpu")
METAL = Build("mistralrs-metal", "0.9.5", "metal")
GIB = 2**30


@pytest.fixture
def gguf(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(bytes(20 * 2**20))  # only its size is read: 20 MiB of Q4_1 grows by 14 MiB
    return ModelSource(name="m", path=path, format="gguf")


def test_option_values():
    parse = lambda v: parse_options(MistralRsOptions, "mistralrs", {"isq": v}).isq  # noqa: E731
    assert MistralRsOptions().isq == "auto"
    assert [parse(v) for v in ("AUTO", "None", None, "", "q8_0")] == ["auto", "none", "none", "none", "Q8_0"]


@pytest.mark.parametrize("file_type", ["Q4_1", "Q5_0", "Q5_1"])
def test_auto_requantizes_the_types_candle_runs_in_a_portable_loop(gguf, file_type):
    choice = resolve_isq("auto", gguf, file_type, CPU, available_bytes=8 * GIB)
    assert choice.isq == "Q8_0"
    assert f"{file_type} weights requantized to Q8_0" in choice.reason and 'isq = "none"' in choice.reason


@pytest.mark.parametrize("file_type", ["Q4_0", "Q8_0", "Q6_K", "F16", None])
def test_auto_keeps_types_with_simd_kernels(gguf, file_type):
    assert resolve_isq("auto", gguf, file_type, CPU, available_bytes=8 * GIB).isq is None


def test_auto_keeps_the_file_where_the_growth_would_not_fit(gguf):
    choice = resolve_isq("auto", gguf, "Q4_1", CPU, available_bytes=20 * 2**20)
    assert choice.isq is None
    assert "would add about 14 MiB and 20 MiB is available" in choice.reason
    assert resolve_isq("auto", gguf, "Q4_1", CPU, available_bytes=28 * 2**20).isq == "Q8_0"


def test_auto_leaves_gpu_builds_and_hugging_face_weights_alone(gguf, tmp_path):
    assert resolve_isq("auto", gguf, "Q4_1", METAL, available_bytes=8 * GIB).isq is None
    hf = ModelSource(name="m", path=tmp_path, format="hf")
    assert resolve_isq("auto", hf, None, CPU, available_bytes=8 * GIB).isq is None


def test_a_named_type_or_none_is_taken_as_given(gguf):
    assert resolve_isq("none", gguf, "Q4_1", CPU).isq is None
    assert resolve_isq("Q4K", gguf, "Q8_0", METAL).isq == "Q4K"
    assert resolve_isq("Q4K", gguf, "Q8_0", METAL).reason is None
