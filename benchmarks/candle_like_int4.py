"""candle_like on packed int4 weights against dense ones, side by side in one process.

    .venv/bin/python benchmarks/candle_like_int4.py --threads 2 --batches 1,4,16,64 --tokens 16

Loads the embedded model twice: with ``int4_weights`` (the GGUF's Q4_1 blocks on torch's int4
kernel, without the dense copy, so int4 runs at every row count) and without (the blocks
dequantised into the compute dtype, oneDNN-packed). Prints:

- the projections of one decode step alone (30 layers of q/k/v, o, gate/up, down; the head is
  dense in both), ms at each batch size, best of --runs, the two models taking turns;
- whole-model decode tok/s through the paged executor at each batch size (median of --runs);
- the projection weights' resident bytes either way, and the dense copy's cost
  (``dense_weights``).

The crossover row count is where the dense column overtakes int4: ``dense_from_rows``'s default.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from candle_like_decode import PROMPT, batched
from ruvllm.bench.machine import machine_line
from ruvllm.models import ModelSource
from ruvllm.registry import embedded_model_path
from ruvllm_candle_like.backend import CandleLikeBackend
from ruvllm_candle_like.projection import BlockProjection, Projection

MIB = 1 << 20


def projections(backend: CandleLikeBackend) -> list[Projection | BlockProjection]:
    return [p for layer in backend.model.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down)]


def weight_bytes(backend: CandleLikeBackend) -> int:
    """Resident bytes of the projection weights (plain, packed, int4, dense copy)."""
    return sum(p.nbytes() for p in projections(backend))


def linears_ms(backend: CandleLikeBackend, rows: int, runs: int) -> float:
    """Best of ``runs``: one decode step's projections alone, ``rows`` rows each."""
    dtype = backend.model.dtype
    inputs = {k: torch.randn(rows, k, dtype=dtype) for k in {p.shape[1] for p in projections(backend)}}
    projs = projections(backend)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(runs + 1):
            t0 = time.perf_counter()
            for p in projs:
                p(inputs[p.shape[1]])
            best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--tokens", type=int, default=16, help="decode steps per whole-model run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dtype", default="auto")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    batches = [int(b) for b in a.batches.split(",")]
    src = ModelSource.from_path(embedded_model_path())
    common = {"dtype": a.dtype, "n_threads": a.threads}
    # int4 without its dense copy: every row count on the int4 kernel, to find the crossover.
    models = {"int4": CandleLikeBackend.load(src, {**common, "int4_weights": True, "dense_weights": False}),
              "dense": CandleLikeBackend.load(src, {**common, "int4_weights": False})}
    dtype = str(models["dense"].model.dtype).removeprefix("torch.")
    print(machine_line())
    print(f"model {src.path.name} ({src.path.stat().st_size / MIB:.1f} MiB), {a.threads} threads, "
          f"dense = {dtype}, int4 = bf16 activations on aten._weight_int4pack_mm_for_cpu, group 32")
    ids = models["dense"].tokenizer.encode(PROMPT)
    lin: dict[str, dict[int, float]] = {k: {} for k in models}
    tok: dict[str, dict[int, list[float]]] = {k: {b: [] for b in batches} for k in models}
    for b in batches:
        for name, backend in models.items():
            lin[name][b] = linears_ms(backend, b, a.runs)
    for _ in range(a.runs):
        for b in batches:
            for name, backend in models.items():
                tok[name][b].append(batched(backend, ids, b, a.tokens))
    print("\n| batch | linears int4 ms | linears dense ms | int4 / dense | model int4 tok/s | "
          "model dense tok/s | int4 / dense |")
    print("|---|---|---|---|---|---|---|")
    for b in batches:
        ti, td = (statistics.median(tok[k][b]) for k in ("int4", "dense"))
        li, ld = lin["int4"][b], lin["dense"][b]
        print(f"| {b} | {li:.1f} | {ld:.1f} | {li / ld:.2f}x | {ti:.1f} | {td:.1f} | {ti / td:.2f}x |")
    int4_bytes, dense_bytes = weight_bytes(models["int4"]), weight_bytes(models["dense"])
    copy = sum(p.shape.numel() for p in projections(models["int4"])) * models["dense"].model.dtype.itemsize
    print(f"\nprojection weights resident: int4 {int4_bytes / MIB:.1f} MiB, "
          f"dense {dense_bytes / MIB:.1f} MiB (plain + oneDNN-packed copy); dense_weights=true adds "
          f"{copy / MIB:.1f} MiB to int4's (one {dtype} copy, packed)")


if __name__ == "__main__":
    main()
