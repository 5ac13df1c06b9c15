"""The per-step choice of an int4 projection: int4 below ``dense_rows`` rows, its dense copy from
there on (``dense_weights``), int4 at every row count without one; and the options that set it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from ruvllm_candle_like import blockmm
from ruvllm_candle_like.backend import CandleLikeBackend
from ruvllm_candle_like.int4 import PackedInt4, requantize
from ruvllm_candle_like.projection import BlockProjection, Projection, pack_weight


@pytest.fixture(scope="module")
def weights():
    gen = torch.Generator().manual_seed(0)
    codes = requantize(torch.randn(96, 64, generator=gen).numpy())
    return codes, torch.randn(20, 64, generator=gen)


def _paths(proj: BlockProjection, x: torch.Tensor, dense: torch.Tensor) -> list[str]:
    """Which kernel served each row count 1..len(x), told apart by their different bits."""
    out = []
    for rows in range(1, len(x) + 1):
        got = proj(x[:rows])
        if torch.equal(got, proj.kernel.matmul(x[:rows]).float()):
            out.append("int4")
        elif torch.equal(got, F.linear(x[:rows], dense)):
            out.append("dense")
        else:
            out.append("neither")
    return out


def test_with_a_dense_copy_rows_from_dense_rows_on_take_it(weights):
    codes, x = weights
    dense = torch.from_numpy(np.ascontiguousarray(codes.dequantize()))
    proj = BlockProjection(PackedInt4.pack(codes), None, dtype=torch.float32, dense=dense, dense_rows=8)
    assert _paths(proj, x, dense) == ["int4"] * 7 + ["dense"] * 13
    assert proj.held == "torch's int4 kernel + dense copy"
    # The oneDNN-packed copy (where this CPU packs float32) is served the same way.
    onednn = pack_weight(dense)
    if onednn is not None:
        packed = BlockProjection(PackedInt4.pack(codes), None, dtype=torch.float32, dense=onednn,
                                 dense_rows=8)
        assert torch.allclose(packed(x[8:]), F.linear(x[8:], dense), atol=1e-5)


def test_without_a_dense_copy_every_row_count_runs_int4(weights):
    codes, x = weights
    dense = torch.from_numpy(np.ascontiguousarray(codes.dequantize()))
    proj = BlockProjection(PackedInt4.pack(codes), None, dtype=torch.float32)
    assert _paths(proj, x, dense) == ["int4"] * 20
    assert _paths(BlockProjection(PackedInt4.pack(codes), None, dtype=torch.float32, dense=dense,
                                 dense_rows=8).kernel_only(), x, dense) == ["int4"] * 20


#: The default (int4_weights=auto): the GGUF's blocks where ruvllm's kernel runs, else dense.
DEFAULT_KIND = BlockProjection if blockmm.unavailable() is None else Projection


@pytest.mark.parametrize(("options", "kind", "dense_rows"), [
    ({"int4_weights": True}, BlockProjection, None),
    ({"int4_weights": True, "dense_weights": True}, BlockProjection, 20),
    ({"int4_weights": True, "dense_weights": True, "dense_from_rows": 8}, BlockProjection, 8),
    ({}, DEFAULT_KIND, None),
    ({"int4_weights": False}, Projection, None),
    # auto stays dense in bfloat16: the kind with native bf16 has its fast matmuls there.
    ({"dtype": "bfloat16"}, Projection, None),
])
def test_the_options_choose_the_projections(embedded_source, options, kind, dense_rows):
    backend = CandleLikeBackend.load(embedded_source, {"dtype": "float32", **options})
    try:
        projections = [p for layer in backend.model.layers
                       for p in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        assert all(type(p) is kind for p in projections)
        # The tied head on the embedding's own Q8_0 blocks where ruvllm's kernel runs.
        head = backend.model.lm_head
        if kind is BlockProjection and blockmm.unavailable() is None:
            assert type(head) is BlockProjection and head.kernel.bits == 8 and head.dense is None
        else:
            assert type(head) is Projection and head.weight is backend.model.embed
        if kind is BlockProjection:
            assert all((p.dense is None) == (dense_rows is None) for p in projections)
            if dense_rows is not None:
                assert {p.dense_rows for p in projections} == {dense_rows}
            else:
                # The GGUF's bytes: 0.5 byte a weight plus a scale and an offset per 32, float16
                # on ruvllm's kernel (the file's own values), bfloat16 on torch's.
                resident = sum(p.nbytes() for p in projections)
                assert resident == sum(p.shape.numel() for p in projections) * (0.5 + 4 / 32)
    finally:
        backend.close()


def test_a_fused_matrix_with_an_unmapped_part_runs_dense_and_says_so(caplog):
    """q/k Q4_1 with a Q3_K v: the whole q/k/v runs dense, exactly dequantised, after one log
    line naming the type."""
    from ruvllm_candle_like import cpu_dtype
    from ruvllm_candle_like.weights import ProjectionFactory

    from .test_block_codes import _random_blocks

    q4 = _random_blocks("Q4_1", 64, 256)
    q3 = _random_blocks("Q3_K", 32, 256, (108,))
    factory = ProjectionFactory(dtype=torch.float32, device=torch.device("cpu"), prepack=False, int4=True)
    cpu_dtype._warned.discard("codes Q3_K")
    with caplog.at_level("WARNING"):
        proj = factory([("blk.0.attn_q.weight", q4), ("blk.0.attn_v.weight", q3)])
    assert type(proj) is Projection
    assert torch.equal(proj.weight, torch.from_numpy(np.concatenate([q4.dequantize(), q3.dequantize()])))
    assert "Q3_K weights (first: blk.0.attn_v.weight) have no block-kernel mapping" in caplog.text
    assert type(factory([("blk.0.attn_q.weight", q4)])) is BlockProjection


@pytest.mark.skipif(blockmm.unavailable() is not None, reason=str(blockmm.unavailable()))
def test_a_q4_k_m_style_fused_matrix_runs_on_8_bit_codes_and_says_what_is_requantised(caplog):
    """q Q4_1 with a Q6_K v (as in Q4_K_M files): one 8-bit matrix on the block kernel, q's
    weights exactly, v's re-quantised within half a step; one log line says so."""
    from ruvllm_candle_like import cpu_dtype
    from ruvllm_candle_like.block_codes import block_codes
    from ruvllm_candle_like.weights import ProjectionFactory

    from .test_block_codes import _random_blocks

    q4 = _random_blocks("Q4_1", 64, 256)
    q6 = _random_blocks("Q6_K", 32, 256)
    factory = ProjectionFactory(dtype=torch.float32, device=torch.device("cpu"), prepack=False, int4=True)
    cpu_dtype._warned.discard("codes Q6_K")
    with caplog.at_level("WARNING"):
        proj = factory([("blk.0.attn_q.weight", q4), ("blk.0.attn_v.weight", q6)])
    assert type(proj) is BlockProjection and proj.kernel.bits == 8
    requantised = block_codes(q6)
    assert requantised is not None
    want = np.concatenate([q4.dequantize(), requantised.dequantize()])
    assert torch.equal(proj.weight, torch.from_numpy(want))
    assert "Q6_K weights (first: blk.0.attn_v.weight) run re-quantised to 8 bits" in caplog.text


@pytest.mark.skipif(blockmm.unavailable() is not None, reason=str(blockmm.unavailable()))
def test_an_untied_embedding_stays_on_its_blocks():
    """A model with its own head (most large ones) keeps the token table on its GGUF blocks too,
    read row by row exactly, instead of a float32 copy of the vocabulary (2 GiB at 128k x 4096)."""
    import gguf
    from ruvllm_candle_like.block_codes import GgufBlocks
    from ruvllm_candle_like.model import Transformer

    from .tiny import tiny_config, tiny_weights

    cfg = tiny_config("mistral", 300)
    assert not cfg.tie_word_embeddings
    q8_0, q4_1 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_1
    weights: dict = {}
    for name, arr in tiny_weights(cfg, 0).items():
        if name.endswith(("_proj.weight", "embed_tokens.weight", "lm_head.weight")):
            qtype = q8_0 if name.endswith("embed_tokens.weight") else q4_1
            weights[name] = GgufBlocks(qtype.name, int(qtype), gguf.quants.quantize(arr, qtype), arr.shape)
        else:
            weights[name] = torch.from_numpy(arr)
    model = Transformer(cfg, weights, dtype=torch.float32, device=torch.device("cpu"), max_positions=64,
                        int4=True)
    assert model.embed is None and model.embedding_blocks is not None and model.embedding_blocks.bits == 8
    tokens = torch.tensor([0, 299, 7, 7, 150])
    table = torch.from_numpy(weights["model.embed_tokens.weight"].dequantize())
    assert torch.equal(model.embed_rows(tokens), table[tokens])
    assert torch.equal(model.embedding_matrix(), table)
    # The head stays its own matrix, on its own (4-bit) blocks.
    assert type(model.lm_head) is BlockProjection and model.lm_head.kernel.bits == 4


@pytest.mark.skipif(blockmm.unavailable() is not None, reason=str(blockmm.unavailable()))
def test_the_banner_says_how_the_weights_are_held(embedded_source):
    """`ruvllm serve` prints the executor's line: which kernel holds how many matrices, in how
    many MiB (the embedded model: 120 projections on 4-bit blocks, the Q8_0 head on 8-bit)."""
    backend = CandleLikeBackend.load(embedded_source, {"dtype": "float32"})
    try:
        line = backend.create_executor(max_sequences=1, block_size=16).describe()
        projections = sum(p.nbytes() for layer in backend.model.layers
                          for p in (layer.qkv, layer.o, layer.gate_up, layer.down))
        head = backend.model.lm_head.nbytes()
        assert (f"weight matrices: 1 on 8-bit blocks ({head / (1 << 20):.1f} MiB), "
                f"120 on 4-bit blocks ({projections / (1 << 20):.1f} MiB)") in line, line
    finally:
        backend.close()
