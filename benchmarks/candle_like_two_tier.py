"""candle_like's two-tier KV cache in the paged executor (the ServingEngine's path) against the
16-bit pool: KV memory at N tokens of context and greedy agreement over the next tokens.

    .venv/bin/python benchmarks/candle_like_two_tier.py --dtype float32 --context 2000 --tokens 64
    .venv/bin/python benchmarks/candle_like_two_tier.py --engine     # also through the ServingEngine

Both executors get the same pool size in tokens (context + generated, whole blocks), one
sequence, 16-token blocks, the prompt prefilled in 512-token chunks (the engine's default step
budget), then greedy decoding. "allocated" is every byte the executor holds; "in use" is the
bytes of the blocks the sequence occupies (cold codes and scales, plus the hot slots it has).
With ``--engine`` the same prompt also runs through a ServingEngine on each cache kind (the
executor created by ``create_executor`` as ``ruvllm serve`` does, the engine's default options).
"""

from __future__ import annotations

import argparse
import os
import time

import attrs
from ruvllm.bench.machine import machine_line
from ruvllm.executor import BatchEntry
from ruvllm.models import ModelSource
from ruvllm.registry import embedded_model_path
from ruvllm.types import GenerationParams
from ruvllm_candle_like.backend import CandleLikeBackend

MIB = 1 << 20
BLOCK = 16
SENTENCE = "The history of the city begins with a small river port and a market. "


def variant(backend: CandleLikeBackend, **options) -> CandleLikeBackend:
    """The same loaded weights with other options (no second load)."""
    return CandleLikeBackend(backend._loaded, attrs.evolve(backend.options, **options), backend._source)


def run_executor(ex, ids: list[int], n_gen: int, chunk: int = 512):
    """(greedy tokens, decode tok/s) after prefilling ``ids`` in ``chunk``-token steps."""
    table = tuple(range(ex.num_blocks))
    logits = None
    for start in range(0, len(ids), chunk):
        part = ids[start:start + chunk]
        last = start + len(part) == len(ids)
        logits = ex.execute([BatchEntry(seq_id=0, tokens=tuple(part), start_pos=start, block_table=table,
                                        sample=last)])
    out = [int(logits[0].argmax())]
    t0 = time.perf_counter()
    for i in range(n_gen - 1):
        entry = BatchEntry(seq_id=0, tokens=(out[-1],), start_pos=len(ids) + i, block_table=table)
        logits = ex.execute([entry])
        out.append(int(logits[0].argmax()))
    return out, (n_gen - 1) / (time.perf_counter() - t0)


def agreement(a: list[int], b: list[int]) -> tuple[int, int]:
    """(positions with the same token, length of the identical prefix)."""
    same = sum(x == y for x, y in zip(a, b, strict=True))
    prefix = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
    return same, prefix


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="float32", help="candle_like dtype option (auto, float32, bfloat16)")
    ap.add_argument("--context", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--bits", type=int, default=4, choices=(4, 8))
    ap.add_argument("--hot", type=int, default=64, help="hot_tokens")
    ap.add_argument("--engine", action="store_true", help="also generate through a ServingEngine")
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    print(machine_line(), flush=True)
    opts = {"dtype": a.dtype} | ({"n_threads": a.threads} if a.threads else {})
    base = CandleLikeBackend.load(ModelSource.from_path(embedded_model_path()), opts)
    ids = base.tokenizer.encode(SENTENCE * (a.context // 10 + 1))[: a.context]
    assert len(ids) == a.context
    pool = -(-(a.context + a.tokens) // BLOCK) * BLOCK
    fp16 = variant(base, kv_cache_tokens=pool)
    tiers = variant(base, kv_cache="two_tier", kv_cache_tokens=pool, cold_bits=a.bits, hot_tokens=a.hot)
    results = {}
    for name, backend in (("fp16", fp16), ("two_tier", tiers)):
        ex = backend.create_executor(max_sequences=1, block_size=BLOCK)
        tokens, rate = run_executor(ex, ids, a.tokens)
        used_blocks = tuple(range(-(-a.context // BLOCK)))
        if ex.two_tier is None:
            in_use = ex.nbytes() * len(used_blocks) // ex.num_blocks
        else:
            in_use = ex.two_tier.sequence_nbytes(used_blocks)
        # in use measured after decoding: the context's blocks (hot window at the end included)
        results[name] = (tokens, rate, ex.nbytes(), in_use)
        print(f"{name:9s} {ex.describe()}", flush=True)
        print(f"{name:9s} allocated {ex.nbytes() / MIB:.2f} MiB, in use by the {a.context}-token context "
              f"{in_use / MIB:.2f} MiB, decode {rate:.1f} tok/s (load {os.getloadavg()[0]:.2f})", flush=True)
    (t16, _, alloc16, use16), (t2, _, alloc2, use2) = results["fp16"], results["two_tier"]
    same, prefix = agreement(t16, t2)
    print(f"two-tier Q{a.bits} (hot {a.hot}) vs fp16 at {a.context} tokens: "
          f"allocated {alloc16 / alloc2:.2f}x smaller, in use {use16 / use2:.2f}x smaller; "
          f"greedy {a.tokens} tokens: {same}/{a.tokens} "
          f"identical, identical prefix {prefix}")
    if a.engine:
        from ruvllm.engine import ServingEngine

        engine_tokens = {}
        variants = (("fp16", variant(base)),
                    ("two_tier", variant(base, kv_cache="two_tier", cold_bits=a.bits, hot_tokens=a.hot)))
        for name, backend in variants:
            with ServingEngine(backend) as engine:
                res = engine.generate_sync([ids], GenerationParams(max_tokens=a.tokens, ignore_eos=True))
                engine_tokens[name] = list(res[0].token_ids)
                print(f"engine {name}: {backend.memory_summary()}", flush=True)
        same, prefix = agreement(engine_tokens["fp16"], engine_tokens["two_tier"])
        print(f"through the ServingEngine: greedy {a.tokens} tokens {same}/{a.tokens} identical, "
              f"identical prefix {prefix}; executor vs engine (two_tier): "
              f"{'same' if engine_tokens['two_tier'] == t2 else 'different'} tokens")


if __name__ == "__main__":
    main()
