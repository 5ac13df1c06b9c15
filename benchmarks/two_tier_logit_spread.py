"""How far candle_like's two-tier KV cache moves logits, through the ServingEngine (``ruvllm serve``'s
path): the figures behind the two-tier bounds of the conformance suite's near-tie rule
(docs/conformance.md) and of tests/candle_like/test_two_tier_executor.py.

    .venv/bin/python benchmarks/two_tier_logit_spread.py --bits 4 --lengths 80,200,500 --variants 4

For each prompt of L tokens (``--variants`` of ``ruvllm.testing.support.prompt_of_tokens``' prose
and as many slices of this repository's docs; lengths above ``hot_tokens``, so the cold tier is
read) the 16-bit pool's engine generates ``--tokens`` greedy tokens, recording every logits row.
A two-tier engine is then teacher-forced on those tokens (``ruvllm.testing.isolation``), so
every position is computed on the same context by both caches, three ways:

- ``fresh``: the prompt prefilled in one chunk: its first row attends to the step's own exact
  K/V, and decode rows read the prompt's cold blocks;
- ``prefix-hit``: the same prompt again, its full blocks from the prefix cache: even the first
  row reads them dequantised (what a request run after another one sharing its prefix, or
  recomputed after preemption, sees);
- ``batched``: all prompts of a length at once (prefill chunks split by the step budget).

Per way: the largest max |logit difference| over the vocabulary against the 16-bit row (what
the near-tie rule's ``distance_bound`` must exceed), the largest drop of the reference token's
lead over one of the 10 next tokens (a flip can only happen at a reference margin below it: what
``margin_bound`` must exceed), and each position where the top token differs, with the
reference row's top-2 margin there and the distance. ``solo-vs-*`` compare two-tier runs with
each other: what the conformance suite's isolation tests compare on a two-tier backend.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import attrs
import numpy as np
from ruvllm.bench.machine import machine_line
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.models import ModelSource
from ruvllm.registry import embedded_model_path
from ruvllm.testing.isolation import LogitsRecorder, TeacherForcer, top2_margin
from ruvllm.testing.support import prompt_of_tokens
from ruvllm.types import GenerationParams
from ruvllm_candle_like.backend import CandleLikeBackend

DOCS = Path(__file__).resolve().parent.parent / "docs"


def variant(backend: CandleLikeBackend, **options) -> CandleLikeBackend:
    return CandleLikeBackend(backend._loaded, attrs.evolve(backend.options, **options), backend._source)


def recorded(engine: ServingEngine, prompts, params, forced=None):
    """Rows of every prompt, submitted together; teacher-forced on ``forced`` tokens when given."""
    procs = [LogitsRecorder() if f is None else TeacherForcer(f) for f in (forced or [None] * len(prompts))]
    handles = [engine.submit_sync(p, params, logits_processors=[r])
               for p, r in zip(prompts, procs, strict=True)]
    results = [h.result(timeout=1800) for h in handles]
    return [list(r.token_ids) for r in results], [np.stack(r.rows) for r in procs]


def preference_drop(a: np.ndarray, b: np.ndarray, token: int, top: int = 10) -> float:
    """Most that ``b`` lowers ``token``'s lead over one of ``a``'s ``top`` best other tokens:
    ``b`` picks another token only where ``a``'s margin is below this, so the near-tie rule's
    ``margin_bound`` must exceed it."""
    others = [o for o in np.argsort(a)[::-1][: top + 1] if o != token][:top]
    return max(float((a[token] - a[o]) - (b[token] - b[o])) for o in others)


def compare(name: str, ref_tokens, ref_rows, rows, out: dict) -> None:
    dists, drops, flips = [], [], []
    for toks, a, b in zip(ref_tokens, ref_rows, rows, strict=True):  # toks None: a's top tokens
        d = np.abs(a.astype(np.float64) - b).max(axis=-1)
        dists.extend(d.tolist())
        for k in range(len(a)):
            t = int(a[k].argmax()) if toks is None else toks[k]
            drops.append(preference_drop(a[k].astype(np.float64), b[k].astype(np.float64), t))
            if int(b[k].argmax()) != t:
                flips.append((top2_margin(a[k], t), float(d[k])))
    agg = out.setdefault(name, {"dists": [], "drops": [], "flips": []})
    agg["dists"] += dists
    agg["drops"] += drops
    agg["flips"] += flips


def report(label: str, out: dict) -> None:
    for name, agg in out.items():
        d, drop = np.array(agg["dists"]), np.array(agg["drops"])
        flips = sorted(agg["flips"], reverse=True)
        worst = ", ".join(f"margin {m:.3f} dist {x:.2f}" for m, x in flips[:4])
        print(f"{label} {name:20s} positions {len(d):4d}: max |diff| {d.max():.3f} (p99 "
              f"{np.percentile(d, 99):.3f}, median {np.median(d):.3f}); preference drop max {drop.max():.3f} "
              f"(p99 {np.percentile(drop, 99):.3f}); top token differs at {len(flips)} "
              f"(largest reference margins: {worst or '-'})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--bits", type=int, default=4, choices=(4, 8))
    ap.add_argument("--hot", type=int, default=None, help="hot_tokens (default: the backend's)")
    ap.add_argument("--migrate", type=int, default=None, help="migrate_tokens (default: the backend's)")
    ap.add_argument("--lengths", default="80,200,500")
    ap.add_argument("--variants", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--kv-tokens", type=int, default=8192, help="kv_cache_tokens of both engines")
    a = ap.parse_args()
    print(machine_line(), flush=True)
    base = CandleLikeBackend.load(ModelSource.from_path(embedded_model_path()),
                                  {"dtype": a.dtype, "kv_cache_tokens": a.kv_tokens})
    extra = {k: v for k, v in (("hot_tokens", a.hot), ("migrate_tokens", a.migrate)) if v is not None}
    tiers = variant(base, kv_cache="two_tier", cold_bits=a.bits, **extra)
    params = GenerationParams(max_tokens=a.tokens, temperature=0.0, ignore_eos=True)
    # Half the prompts are the suite's prose, half this repository's docs (less predictable text).
    docs = base.tokenizer.encode(" ".join(p.read_text() for p in sorted(DOCS.glob("*.md"))))
    total: dict = {}
    t0 = time.perf_counter()
    for length in (int(x) for x in a.lengths.split(",")):
        prompts = [prompt_of_tokens(base.tokenizer, length, variant=v) for v in range(a.variants)]
        prompts += [docs[v * 7919 % (len(docs) - length):][:length] for v in range(a.variants)]
        with ServingEngine(base, EngineOptions(), owns_backend=False) as eng:
            ref_tokens = []
            ref_rows = []
            for p in prompts:  # one at a time: the reference is each prompt alone
                toks, rows = recorded(eng, [p], params)
                ref_tokens += toks
                ref_rows += rows
        out: dict = {}
        with ServingEngine(tiers, EngineOptions(), owns_backend=False) as eng:
            fresh, hit = [], []
            for p, toks in zip(prompts, ref_tokens, strict=True):
                fresh += recorded(eng, [p], params, [toks])[1]
                hit += recorded(eng, [p], params, [toks])[1]
            summary = eng.backend.memory_summary()
            store = eng._core.executor.two_tier
            print(f"L={length}: {store.migrated_blocks} blocks migrated, {store.evicted_blocks} evicted, "
                  f"{store.promoted_blocks} promoted", flush=True)
        with ServingEngine(tiers, EngineOptions(), owns_backend=False) as eng:
            batched = recorded(eng, prompts, params, ref_tokens)[1]
        compare("fresh-vs-fp16", ref_tokens, ref_rows, fresh, out)
        compare("prefix-hit-vs-fp16", ref_tokens, ref_rows, hit, out)
        compare("batched-vs-fp16", ref_tokens, ref_rows, batched, out)
        # Two-tier against two-tier: the reference token is the first run's own top token.
        compare("solo-vs-prefix-hit", [None] * len(prompts), fresh, hit, out)
        compare("solo-vs-batched", [None] * len(prompts), fresh, batched, out)
        report(f"L={length:4d}", out)
        for k, v in out.items():
            for field, values in v.items():
                total.setdefault(k, {}).setdefault(field, []).extend(values)
    print(summary)
    report("all   ", total)
    print(f"{time.perf_counter() - t0:.0f} s; {machine_line()}")


if __name__ == "__main__":
    main()
