"""ruvllm's block kernel (ruvllm_candle_like.blockmm, csrc/blockmm.cpp): the weights it computes
with are llama.cpp's bit for bit, its products are float32 sums of them, and a row's bits do not
depend on the rows beside it.

It runs on x86-64 with AVX2, FMA and F16C (every CPU kind CI meets); elsewhere these tests skip with the
reason the backend logs, and the int4 projections run on torch's kernel (test_int4.py).
"""

from __future__ import annotations

import pytest
import torch
from ruvllm.gguf_file import read_gguf_file
from ruvllm.hardware import cpu_info
from ruvllm.registry import embedded_model_path
from ruvllm_candle_like import blockmm
from ruvllm_candle_like.auto_claim import KERNEL_BYTES
from ruvllm_candle_like.block_codes import BlockCodes, block_codes, concat
from ruvllm_candle_like.blockmm import BlockWeights

from .test_block_codes import _blocks, _random_blocks

pytestmark = pytest.mark.skipif(blockmm.unavailable() is not None, reason=str(blockmm.unavailable()))


def test_every_quantised_tensor_of_the_embedded_model_dequantises_exactly():
    """210 Q4_1 projections and the Q8_0 token embedding (the tied head), read back through the
    kernel on an identity: llama.cpp's float32 weights, every bit."""
    f = read_gguf_file(embedded_model_path())
    seen = set()
    for t in f.tensors:
        if t.type_name not in ("Q4_1", "Q8_0"):
            continue
        blocks = _blocks(f, t)
        weights = BlockWeights.from_codes(_codes(blocks))
        assert torch.equal(weights.dequantize(), torch.from_numpy(blocks.dequantize())), t.name
        # The file's f16 scales and offsets stay f16: 20 bytes a block, as in the file.
        assert weights.scale.dtype == weights.offset.dtype == torch.float16, t.name
        seen.add(t.type_name)
    assert seen == {"Q4_1", "Q8_0"}


def _codes(blocks) -> BlockCodes:
    codes = block_codes(blocks)
    assert codes is not None
    return codes


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K"])
@pytest.mark.parametrize("int8", [False, True], ids=["float-layout", "int8-layout"])
def test_the_other_types_dequantise_exactly(type_name, int8):
    blocks = _random_blocks(type_name, 40, 512)  # 40 outputs: a padded last panel
    weights = BlockWeights.from_codes(_codes(blocks), int8=int8)
    assert torch.equal(weights.dequantize(), torch.from_numpy(blocks.dequantize()))
    # The K-quants' scales are products of two (d * sc), which float16 does not hold: their two
    # factors, as the file has them (bytes), multiplied in the kernel.
    assert weights.scale.dtype == (torch.uint8 if type_name.endswith("_K") else torch.float16)


@pytest.mark.parametrize("type_name", sorted(KERNEL_BYTES))
@pytest.mark.parametrize("int8", [False, True], ids=["float-layout", "int8-layout"])
def test_the_claim_counts_the_bytes_the_kernel_holds(type_name, int8):
    """auto_claim.KERNEL_BYTES, what the claim weighs a model's memory by, is what the weights take."""
    weights = BlockWeights.from_codes(_codes(_random_blocks(type_name, 32, 512)), int8=int8)
    assert weights.nbytes == 32 * 512 * KERNEL_BYTES[type_name] // 32


def _weights(kind: str, n: int, k: int, *, int8: bool = False) -> BlockWeights:
    """Random blocks as a GGUF holds them (``code * scale`` is exact in float32): Q8_0, Q4_1 and
    Q5_0 run with float16 scales, the K-quants with their factors; "Q4_K+Q8_0" is a fused matrix
    of two widths (8-bit codes, unsigned groups with offsets beside signed ones)."""
    if kind == "Q4_K+Q8_0":
        half = n // 2
        codes = concat([_codes(_random_blocks("Q4_K", half, k)), _codes(_random_blocks("Q8_0", n - half, k))])
    else:
        codes = _codes(_random_blocks(kind, n, k))
    return BlockWeights.from_codes(codes, int8=int8)


KINDS = ("Q4_1", "Q4_K", "Q8_0", "Q5_0", "Q5_1", "Q5_K", "Q4_K+Q8_0")
#: The K-quants' super-blocks need k a multiple of 256, so the short k (one partial chunk) is for
#: the others.
SHAPES = [*((kind, 200, 1536) for kind in KINDS), ("Q4_1", 96, 64), ("Q5_0", 96, 64), ("Q8_0", 96, 64)]


# Row counts that reach every path: the register kernel (1-4 rows), the buffered 6-row kernel with
# each partial group (5-13), several groups, and a prefill chunk; k = 1536 spans 6 dequantised
# chunks of 256 inputs, n = 200 ends in a partial panel.
ROWS = (*range(1, 14), 16, 64, 300)


@pytest.mark.parametrize(("kind", "n", "k"), SHAPES)
def test_products_are_float32_sums_of_the_weights(kind, n, k):
    """Against float64: each output within float32's rounding of a k-term sum (k ulps of the sum
    of absolute terms, a loose form of the textbook bound that a wrong weight or row misses by far)."""
    w = _weights(kind, n, k)
    exact_w = w.dequantize().double()
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(max(ROWS), k, generator=gen)
    for rows in ROWS:
        got = w.matmul(x[:rows])
        assert got.shape == (rows, n) and got.dtype == torch.float32
        want = x[:rows].double() @ exact_w.T
        bound = k * 2.0**-24 * (x[:rows].double().abs() @ exact_w.abs().T)
        assert bool(((got.double() - want).abs() <= bound).all()), rows


@pytest.mark.parametrize("kind", KINDS)
def test_a_row_has_the_same_bits_at_every_row_count(kind):
    """The batch-invariant mode and the batched == solo tests rest on it: one FMA chain per output,
    in input order, on every path."""
    w = _weights(kind, 200, 768)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(70, 768, generator=gen)
    alone = torch.cat([w.matmul(x[i:i + 1]) for i in range(70)])
    for rows in range(2, 71):
        assert torch.equal(w.matmul(x[:rows]), alone[:rows]), rows


@pytest.fixture(params=[1, 2], ids=["best-path", "avx2-path"])
def int8_path(request, monkeypatch):
    """Both int8 paths on any machine: the best this CPU has (VNNI where present) and AVX2."""
    monkeypatch.setattr(blockmm, "INT8_PATH", request.param)
    return request.param


def _int8_weights(kind: str, n: int, k: int) -> BlockWeights:
    return _weights(kind, n, k, int8=True)


def _int8_reference(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's Q8_1 scheme on float32 ``x`` against float32 weights ``w`` [n, k], summed in
    float64: per block of 32, da = max|x| / 127 and codes round-half-even(x * 127 / max|x|)
    (float32 as the kernel computes them); the result and a bound on the kernel's float32
    rounding (a few roundings per block, each under 2^-24 of the terms' magnitude)."""
    rows, k = x.shape
    xb = x.view(rows, k // 32, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros_like(amax))
    q = torch.round(xb * inv)  # float32 product, half to even
    da = amax / 127
    dequant = (q.double() * da.double()).view(rows, k)
    want = dequant @ w.double().T
    bound = 8 * (k // 32) * 2.0**-24 * (dequant.abs() @ w.double().abs().T) + 1e-30
    return want, bound


@pytest.mark.parametrize(("kind", "n", "k"), SHAPES)
def test_int8_activations_are_llama_cpps_q8_1_products(int8_path, kind, n, k):
    """The int8 kernel computes what llama.cpp's Q8_1 activations times the blocks give, to
    float32's rounding: not merely "close to the float result" (int8 codes are 0.5 % off that)."""
    w = _int8_weights(kind, n, k)
    assert w.int8
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(max(ROWS), k, generator=gen) * torch.linspace(0.01, 10, k)  # blocks of every scale
    x[3, :32] = 0  # an all-zero block: da = 0, codes 0
    want, bound = _int8_reference(x, w.dequantize())
    for rows in ROWS:
        got = w.matmul(x[:rows]).double()
        assert bool(((got - want[:rows]).abs() <= bound[:rows]).all()), rows


@pytest.mark.parametrize("kind", KINDS)
def test_the_int8_layout_holds_the_same_weights_and_keeps_rows_invariant(int8_path, kind):
    """Same codes, scales and offsets in the int8 kernel's layout (signed groups as q + 128 with -128 d),
    and a row's bits again independent of the rows beside it: each row is quantised alone."""
    n, k = 200, 768
    float_layout, int8_layout = _weights(kind, n, k), _int8_weights(kind, n, k)
    assert torch.equal(int8_layout.dequantize(), float_layout.dequantize())
    index = torch.tensor([0, 199, 7, 8, 15, 16, 7, 192])
    assert torch.equal(int8_layout.rows(index), float_layout.rows(index))
    for outside in ([200], [-1], [3, 200]):  # refused, never read past the table
        with pytest.raises(IndexError, match="of a 200-row matrix"):
            int8_layout.rows(torch.tensor(outside))
    x = torch.randn(70, k, generator=torch.Generator().manual_seed(5))
    alone = torch.cat([int8_layout.matmul(x[i:i + 1]) for i in range(70)])
    for rows in range(2, 71):
        assert torch.equal(int8_layout.matmul(x[:rows]), alone[:rows]), rows


@pytest.mark.parametrize("kind", KINDS)
def test_both_int8_paths_give_the_same_bits(monkeypatch, kind):
    """AVX2 and VNNI sum the same integers exactly and run the same float epilogue: a model
    answers alike on either kind of CPU (on an AVX2 machine both settings take the AVX2 path)."""
    w = _int8_weights(kind, 200, 768)
    x = torch.randn(37, 768, generator=torch.Generator().manual_seed(9)) * 3
    monkeypatch.setattr(blockmm, "INT8_PATH", 1)
    best = [w.matmul(x[:rows]) for rows in (1, 4, 5, 37)]
    monkeypatch.setattr(blockmm, "INT8_PATH", 2)
    assert all(torch.equal(w.matmul(x[:rows]), b) for rows, b in zip((1, 4, 5, 37), best, strict=True))


def test_an_emulated_cpu_without_vnni_takes_the_avx2_path(monkeypatch):
    """Under ONEDNN_MAX_CPU_ISA below AVX512_CORE_VNNI (how an AVX2 machine is emulated on a newer
    one) the kernel runs its AVX2 path, as on that machine."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert blockmm.int8_path() == 2
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "ALL")
    assert blockmm.int8_path() == (blockmm.INT8_PATH if cpu_info().has("avx512_vnni") else 2)


def test_bfloat16_activations_are_widened_not_rounded():
    """A bf16 model's rows enter as float32 (exact), so bf16 input gives the float32 result of the
    same values."""
    w = _weights("Q4_1", 64, 256)
    x = torch.randn(5, 256).bfloat16()
    assert torch.equal(w.matmul(x), w.matmul(x.float()))


def test_a_compiled_graph_calls_the_kernel():
    """compile_decode traces the projections: the kernel is an op inductor calls, same bits."""
    w = _weights("Q4_1", 64, 256)
    x = torch.randn(3, 256)
    compiled = torch.compile(lambda t: w.matmul(t) * 2, fullgraph=True)
    assert torch.equal(compiled(x), w.matmul(x) * 2)


@pytest.mark.parametrize("kind", KINDS)
def test_rows_are_the_dequantised_rows(kind):
    """A tied head's blocks also serve the token embedding (model.py): a row looked up is the row
    the kernel computes with, bit for bit, in any order and with repeats, padding panel included."""
    w = _weights(kind, 200, 768)
    index = torch.tensor([0, 199, 7, 8, 15, 16, 7, 192])
    assert torch.equal(w.rows(index), w.dequantize()[index])
