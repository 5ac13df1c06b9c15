"""How near this CPU's own ceiling each engine already runs: what bounds issue 59's speed targets.

    .venv/bin/python benchmarks/cpu_ceiling.py --threads 2

Every figure is measured here, in one process, each best of ``--runs``:

- the machine's matrix-multiply ceiling: ``torch.mm`` of 2048 x 2048 matrices in float32 (and
  in bfloat16 where this CPU has native bf16), GFLOP/s;
- a prompt chunk of ``--chunk`` tokens through candle_like's paged executor, as served: float32
  dense projections (candle_like on a CPU without native bf16; bfloat16 where it has it), tok/s
  and the projections' GFLOP/s (2 x weights x tokens; attention and the one head row are left
  out, so the figure is a floor);
- the same chunk through llama.cpp (llama-cpp-python, the GGUF's own Q4_1 kernels, flash
  attention on as ruvllm's pool runs it), tok/s;
- one decode step of candle_like on int4 weights at 1 and 16 rows (``--rows``; the mean of 7
  steps, best of ``--runs``): ms, and how much of it is the projections alone.

A serving benchmark cannot beat the prompt rates above on a long-prompt load, nor the decode
steps on a short one: dividing the work of a load by these rates bounds the ratio any server
built on these kernels can reach against llama-server there.
"""

from __future__ import annotations

import argparse
import time

import torch
from candle_like_decode import PROMPT, batched
from candle_like_int4 import linears_ms, projections
from ruvllm.bench.machine import machine_line
from ruvllm.executor import BatchEntry
from ruvllm.hardware import cpu_info
from ruvllm.models import ModelSource
from ruvllm.registry import embedded_model_path
from ruvllm_candle_like.backend import CandleLikeBackend

#: Decode steps per timed run of the int4 steps (candle_like_decode.batched, after its prefill).
DECODE_STEPS = 8


def best(fn, runs: int) -> float:
    """Best wall seconds of ``runs`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def gemm_gflops(dtype: torch.dtype, runs: int, n: int = 2048) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return 2 * n**3 / best(lambda: torch.mm(a, b), runs) / 1e9


def prompt_ids(backend: CandleLikeBackend, tokens: int) -> list[int]:
    ids = backend.tokenizer.encode(PROMPT)
    return (ids * (tokens // len(ids) + 1))[:tokens]


def candle_chunk_s(backend: CandleLikeBackend, ids: list[int], runs: int) -> float:
    """One prompt chunk as the serving engine runs it: a fresh sequence in the paged executor."""
    block = 16
    ex = backend.create_executor(max_sequences=1, block_size=block)
    table = tuple(range(-(-len(ids) // block)))
    entry = BatchEntry(seq_id=0, tokens=tuple(ids), start_pos=0, block_table=table)
    with torch.inference_mode():
        return best(lambda: ex.execute([entry]), runs)


def llamacpp_chunk_s(path: str, ids: list[int], threads: int, runs: int) -> float:
    import llama_cpp

    llm = llama_cpp.Llama(path, n_ctx=2 * len(ids), n_batch=len(ids), n_ubatch=len(ids), n_threads=threads,
                          n_threads_batch=threads, flash_attn=True, verbose=False)

    def once() -> None:
        llm.reset()
        llm.eval(ids)

    try:
        return best(once, runs)
    finally:
        llm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=512, help="prompt tokens per chunk (the engine's step)")
    ap.add_argument("--rows", default="1,16", help="decode rows of the int4 steps")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(machine_line())
    src = ModelSource.from_path(embedded_model_path())
    native_bf16 = cpu_info().bf16_missing() is None
    print("\n| what | figure |\n|---|---|")
    print(f"| torch.mm 2048^3 float32 | {gemm_gflops(torch.float32, a.runs):.0f} GFLOP/s |")
    if native_bf16:
        print(f"| torch.mm 2048^3 bfloat16 | {gemm_gflops(torch.bfloat16, a.runs):.0f} GFLOP/s |")

    dense = CandleLikeBackend.load(src, {"dtype": "auto", "n_threads": a.threads, "int4_weights": False})
    ids = prompt_ids(dense, a.chunk)
    weights = sum(p.shape.numel() for p in projections(dense))
    dtype = str(dense.model.dtype).removeprefix("torch.")
    chunk = candle_chunk_s(dense, ids, a.runs)
    print(f"| candle_like {dtype}, {a.chunk}-token prompt chunk | {a.chunk / chunk:.0f} tok/s, projections "
          f"{2 * weights * a.chunk / chunk / 1e9:.0f} GFLOP/s |")
    del dense
    cpp = llamacpp_chunk_s(str(src.path), ids, a.threads, a.runs)
    print(f"| llama.cpp Q4_1, {a.chunk}-token prompt chunk | {a.chunk / cpp:.0f} tok/s, projections "
          f"{2 * weights * a.chunk / cpp / 1e9:.0f} GFLOP/s equivalent |")

    int4 = CandleLikeBackend.load(src, {"dtype": "auto", "n_threads": a.threads, "int4_weights": True,
                                        "dense_weights": False})
    short = int4.tokenizer.encode(PROMPT)
    for rows in (int(r) for r in a.rows.split(",")):
        step = rows * 1e3 / max(batched(int4, short, rows, DECODE_STEPS) for _ in range(a.runs))
        lin = linears_ms(int4, rows, a.runs)
        print(f"| candle_like int4 decode step, {rows} row(s) | {step:.1f} ms "
              f"({rows * 1e3 / step:.0f} tok/s); projections alone {lin:.1f} ms ({lin / step:.0%}) |")


if __name__ == "__main__":
    main()
