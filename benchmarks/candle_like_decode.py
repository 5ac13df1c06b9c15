"""candle_like decode throughput: one stream (request level) and N streams in one batched
forward per step (the paged executor), plus the two-tier cache's memory and greedy agreement.

    .venv/bin/python benchmarks/candle_like_decode.py --dtype bfloat16 --batch 16 --tokens 64
    .venv/bin/python benchmarks/candle_like_decode.py --dtype auto,float32,bfloat16 --runs 5

``--dtype`` takes one dtype or several, comma-separated. Each is loaded once (``auto`` is
resolved by the backend, which picks what this CPU computes fast), then the runs go round-robin
over them (auto, float32, bfloat16, auto, float32, ...) so that drift in the host's speed hits
every dtype alike. Prints the machine, model and settings, then one table: per dtype the median
of --runs runs, single stream and --batch sequences, and each figure's ratio to the best of its
column; every figure is measured.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from ruvllm.bench.machine import machine_line
from ruvllm.executor import BatchEntry
from ruvllm.models import ModelSource
from ruvllm.registry import embedded_model_path
from ruvllm.types import GenerationParams
from ruvllm_candle_like.backend import CandleLikeBackend
from ruvllm_candle_like.kv_contiguous import ContiguousCache
from ruvllm_candle_like.kv_two_tier import TwoTierCache, TwoTierSettings

PROMPT = "Write a short story about a robot who learns to paint."


def single_stream(backend, ids, n):
    gen = backend.generate(ids, GenerationParams(max_tokens=n))
    next(gen)  # prefill + first token
    t0 = time.perf_counter()
    for _ in range(n - 1):
        next(gen)
    dt = time.perf_counter() - t0
    gen.close()
    return (n - 1) / dt


def batched(backend, ids, batch, n, block=16):
    ex = backend.create_executor(max_sequences=batch, block_size=block)
    per_seq = -(-(len(ids) + n + 1) // block)
    tables = [tuple(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]
    out = ex.execute([BatchEntry(seq_id=i, tokens=tuple(ids), start_pos=0, block_table=tables[i])
                      for i in range(batch)])
    nxt = out.argmax(-1).tolist()
    pos = len(ids)
    t0 = time.perf_counter()
    for _ in range(n - 1):
        out = ex.execute([BatchEntry(seq_id=i, tokens=(nxt[i],), start_pos=pos, block_table=tables[i])
                          for i in range(batch)])
        nxt = out.argmax(-1).tolist()
        pos += 1
    return batch * (n - 1) / (time.perf_counter() - t0)


def two_tier(backend, n_ctx, n_gen):
    cfg = backend.model.cfg
    sentence = "The history of the city begins with a small river port and a market. "
    ids = backend.tokenizer.encode(sentence * (n_ctx // 10 + 1))[:n_ctx]
    full = ContiguousCache(cfg, n_ctx + n_gen, kv_dtype=torch.float16, compute_dtype=backend.dtype,
                           device=backend.device)
    settings = TwoTierSettings(hot_tokens=64, migrate_tokens=32, bits=4, group_size=cfg.head_dim,
                               max_tokens=n_ctx + n_gen)
    tiers = TwoTierCache(cfg, settings, compute_dtype=backend.dtype, device=backend.device)
    seqs = []
    mem = []
    for cache in (full, tiers):
        logits = backend.step(cache, ids)
        mem.append(cache.nbytes())
        out = []
        for _ in range(n_gen):
            t = int(logits.argmax())
            out.append(t)
            logits = backend.step(cache, [t])
        seqs.append(out)
    split = next((i for i, (a, b) in enumerate(zip(*seqs, strict=True)) if a != b), n_gen)
    return mem, split


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def measure(backends: dict[str, CandleLikeBackend], ids, a) -> dict[str, dict[str, list[float]]]:
    """Per dtype asked, the single-stream and batched tok/s of every run, taken round-robin in a
    rotating order after one untimed warm-up run each."""
    for backend in backends.values():  # untimed: first-call allocations and weight packing
        single_stream(backend, ids, a.tokens)
        batched(backend, ids, a.batch, a.tokens)
    runs = {asked: {"single": [], "batched": []} for asked in backends}
    names = list(backends)
    for r in range(a.runs):
        # Each run starts with the next dtype: no dtype always runs first (or right after another).
        for asked in names[r % len(names):] + names[: r % len(names)]:
            backend = backends[asked]
            one = single_stream(backend, ids, a.tokens)
            many = batched(backend, ids, a.batch, a.tokens)
            runs[asked]["single"].append(one)
            runs[asked]["batched"].append(many)
            print(f"run {r + 1}/{a.runs} {asked}: single {one:.1f} tok/s, {a.batch} sequences "
                  f"{many:.1f} tok/s (load {os.getloadavg()[0]:.2f})", flush=True)
    return runs


def report(backends: dict[str, CandleLikeBackend], runs, a) -> None:
    med = {asked: {k: statistics.median(v) for k, v in r.items()} for asked, r in runs.items()}
    best = {k: max(m[k] for m in med.values()) for k in ("single", "batched")}
    many = f"{a.batch}-seq tok/s"
    print(f"\nmedian of {a.runs} interleaved runs; 'vs best' = this figure / the column's best")
    print(f"{'dtype asked':<12} {'resolved':<9} {'single tok/s':>12} {'vs best':>7} {many:>12} "
          f"{'vs best':>7} {'batch gain':>10}")
    for asked, m in med.items():
        print(f"{asked:<12} {dtype_name(backends[asked].dtype):<9} {m['single']:>12.1f} "
              f"{m['single'] / best['single']:>7.2f} {m['batched']:>12.1f} "
              f"{m['batched'] / best['batched']:>7.2f} {m['batched'] / m['single']:>9.1f}x")
    if "auto" in med and len(med) > 1:
        worst = min(med["auto"][k] / best[k] for k in ("single", "batched"))
        print(f"auto ({dtype_name(backends['auto'].dtype)}) vs the faster dtype: single "
              f"{med['auto']['single'] / best['single']:.2f}, {a.batch} sequences "
              f"{med['auto']['batched'] / best['batched']:.2f} -> within 10 %: {worst >= 0.9}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bfloat16",
                    help="dtype option, or several comma-separated (e.g. auto,float32,bfloat16)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--two-tier", action="store_true",
                    help="also measure the two-tier cache at 2,000 tokens (for each dtype)")
    a = ap.parse_args()
    dtypes = list(dict.fromkeys(d.strip() for d in a.dtype.split(",") if d.strip()))
    if not dtypes:
        ap.error("--dtype names no dtype")
    if a.tokens < 2:
        ap.error("--tokens must be at least 2 (the first token is prefill)")
    torch.set_num_threads(a.threads)
    print(machine_line())
    source = ModelSource.from_path(embedded_model_path())
    backends = {d: CandleLikeBackend.load(source, {"dtype": d}) for d in dtypes}
    first = next(iter(backends.values()))
    ids = first.tokenizer.encode(PROMPT)
    print(f"torch {torch.__version__}, threads {a.threads}; model {first.info.name}; dtypes "
          + ", ".join(f"{d} -> {dtype_name(b.dtype)}" for d, b in backends.items())
          + f"; prompt {len(ids)} tokens, {a.tokens} tokens per stream, batch {a.batch}", flush=True)
    runs = measure(backends, ids, a)
    report(backends, runs, a)
    if a.two_tier:
        for asked, backend in backends.items():
            (full, tiers), split = two_tier(backend, 2000, 64)
            print(f"two-tier Q4 at 2000 tokens ({asked}): {tiers / 2**20:.1f} MiB vs fp16 "
                  f"{full / 2**20:.1f} MiB ({full / tiers:.2f}x smaller); greedy 64 tokens identical "
                  f"for {split}/64")


if __name__ == "__main__":
    main()
