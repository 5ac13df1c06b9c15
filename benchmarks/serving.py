"""Serving benchmark: C concurrent requests through the ServingEngine, for C in 1, 4, 16, 32.

Prints aggregate output tokens/s, time to first token (p50/p95) and time per output token,
with the machine, backend and model named; optionally writes JSON. Every request generates
``--max-tokens`` tokens greedily with EOS ignored, so each concurrency level does the same work
as the direct llama.cpp ceiling (benchmarks/llamacpp_multiseq_ceiling.py), which
``--compare-ceiling`` runs in the same process, alternating with the engine, and puts side by
side as ratios. Figures are medians of ``--repeats`` runs.

    .venv/bin/python benchmarks/serving.py --compare-ceiling --json serving.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from llamacpp_multiseq_ceiling import Model, load_prompts, machine, run_ceiling
from ruvllm.config import load_config
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.plugins import get_registry
from ruvllm.registry import resolve
from ruvllm.types import GenerationParams


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(round(q * (len(s) - 1)), len(s) - 1)]


async def run_engine(engine: ServingEngine, prompts: list[list[int]], max_tokens: int) -> dict:
    params = GenerationParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    handles = [await engine.submit(p, params) for p in prompts]

    async def consume(h):
        first = None
        async for out in h:
            if first is None and out.token_id is not None:
                first = time.perf_counter()
        res = await h.result()
        return first, time.perf_counter(), res

    done = await asyncio.gather(*(consume(h) for h in handles))
    end = max(d[1] for d in done)
    ttfts = [d[0] - start for d in done]
    tpots = [(d[1] - d[0]) / max(len(d[2].token_ids) - 1, 1) for d in done]
    n_out = sum(len(d[2].token_ids) for d in done)
    return {
        "concurrency": len(prompts),
        "output_tokens": n_out,
        "seconds": end - start,
        "output_tok_s": n_out / (end - start),
        "ttft_p50": percentile(ttfts, 0.5),
        "ttft_p95": percentile(ttfts, 0.95),
        "tpot": statistics.median(tpots),
        "outputs": [list(d[2].token_ids) for d in done],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="llamacpp")
    ap.add_argument("--model", default="default")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n-ctx", type=int, default=512, help="context per sequence (llamacpp n_ctx)")
    ap.add_argument("--threads", type=int, default=None,
                    help="llama.cpp threads for the engine and the ceiling (default: the backend's)")
    ap.add_argument("--compare-ceiling", action="store_true",
                    help="also run llama.cpp's multi-sequence batch directly (llamacpp only)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    config = load_config()
    source = resolve(args.model, config.cache_dir)
    backend_cls = get_registry().select(args.backend, source)
    opts: dict = {}
    if backend_cls.name == "llamacpp":
        opts["n_ctx"] = args.n_ctx
        if args.threads:
            opts["n_threads"] = args.threads
    threads = args.threads or len(os.sched_getaffinity(0))
    ceiling_model = Model(str(source.path), threads) if args.compare_ceiling else None

    rows = []
    path = "?"
    for c in args.concurrency:
        engine = ServingEngine(lambda: backend_cls.load(source, opts),
                               EngineOptions(max_num_seqs=c, max_queue=max(c, 256)))
        path = engine.path
        prompts = [engine.encode(p) for p in load_prompts(c)]
        engine.generate_sync([prompts[0]], GenerationParams(max_tokens=4))  # warm-up
        runs, ceil_runs = [], []
        for _ in range(args.repeats):
            runs.append(asyncio.run(run_engine(engine, prompts, args.max_tokens)))
            if ceiling_model is not None:
                ceil_runs.append(run_ceiling(ceiling_model, load_prompts(c), args.max_tokens, args.n_ctx))
        engine.close()
        row = {"concurrency": c}
        for k in ("output_tok_s", "ttft_p50", "ttft_p95", "tpot"):
            row[k] = statistics.median(r[k] for r in runs)
            if ceil_runs:
                row[f"ceiling_{k}"] = statistics.median(r[k] for r in ceil_runs)
        if ceil_runs:
            row["ratio"] = row["output_tok_s"] / row["ceiling_output_tok_s"]
            row["same_tokens_as_ceiling"] = runs[0]["outputs"] == ceil_runs[0]["outputs"]
        rows.append(row)
        print(f"C={c}: {row}", file=sys.stderr)
    if ceiling_model is not None:
        ceiling_model.close()

    head = (f"machine: {machine()}; backend {backend_cls.name} ({backend_cls.version() or '?'}), "
            f"engine path {path}; model {source.name}; {threads} llama.cpp threads; "
            f"{args.max_tokens} tokens/request, greedy, "
            f"EOS ignored; median of {args.repeats}")
    print(head)
    cols = f"{'C':>4} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p95':>9} {'TPOT ms':>8}"
    if ceiling_model is not None:
        cols += f" | {'ceiling tok/s':>13} {'ratio':>6} {'same tokens':>11}"
    print(cols)
    for r in rows:
        line = (f"{r['concurrency']:>4} {r['output_tok_s']:>10.1f} {r['ttft_p50']:>8.3f}s "
                f"{r['ttft_p95']:>8.3f}s {r['tpot'] * 1e3:>8.1f}")
        if "ratio" in r:
            same = str(r["same_tokens_as_ceiling"])
            line += f" | {r['ceiling_output_tok_s']:>13.1f} {r['ratio']:>6.2f} {same:>11}"
        print(line)
    if args.json:
        args.json.write_text(json.dumps({"header": head, "machine": machine(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
