"""candle_like decode throughput: one stream (request level) and N streams in one batched
forward per step (the paged executor), plus the two-tier cache's memory and greedy agreement.

    .venv/bin/python benchmarks/candle_like_decode.py --dtype bfloat16 --batch 16 --tokens 64

Prints the machine, model, settings and the median of --runs runs; every figure is measured.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch
from ruvllm.executor import BatchEntry
from ruvllm.models import ModelSource
from ruvllm.registry import embedded_model_path
from ruvllm.types import GenerationParams
from ruvllm_candle_like.backend import CandleLikeBackend
from ruvllm_candle_like.kv_contiguous import ContiguousCache
from ruvllm_candle_like.kv_two_tier import TwoTierCache, TwoTierSettings


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--two-tier", action="store_true",
                    help="also measure the two-tier cache at 2,000 tokens")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    backend = CandleLikeBackend.load(ModelSource.from_path(embedded_model_path()), {"dtype": a.dtype})
    ids = backend.tokenizer.encode("Write a short story about a robot who learns to paint.")
    print(f"machine: {platform.machine()} {os.cpu_count()} cpus, torch {torch.__version__}, "
          f"threads {a.threads}; model {backend.info.name}; dtype {a.dtype}; "
          f"load avg {os.getloadavg()[0]:.1f}")
    one = statistics.median(single_stream(backend, ids, a.tokens) for _ in range(a.runs))
    print(f"single stream decode: {one:.1f} tok/s (median of {a.runs})")
    many = statistics.median(batched(backend, ids, a.batch, a.tokens) for _ in range(a.runs))
    print(f"executor, {a.batch} sequences: {many:.1f} tok/s aggregate = {many / one:.1f}x single stream")
    if a.two_tier:
        (full, tiers), split = two_tier(backend, 2000, 64)
        print(f"two-tier Q4 at 2000 tokens: {tiers / 2**20:.1f} MiB vs fp16 {full / 2**20:.1f} MiB "
              f"({full / tiers:.2f}x smaller); greedy 64 tokens identical for {split}/64")


if __name__ == "__main__":
    main()
