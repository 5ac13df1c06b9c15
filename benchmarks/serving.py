"""Serving benchmark: C concurrent requests through the ServingEngine, for C in 1, 4, 16, 32.

Prints aggregate output tokens/s, time to first token (p50/p95) and time per output token,
with the machine, backend and model named; optionally writes JSON. Every request generates
``--max-tokens`` tokens greedily with EOS ignored, so each concurrency level does the same work
as the direct llama.cpp ceiling (benchmarks/llamacpp_multiseq_ceiling.py), which
``--compare-ceiling`` runs in the same process, alternating with the engine, and puts side by
side as ratios. ``--compare-direct`` also runs llama-cpp-python's own single-stream generation
(``Llama.generate``, no ruvllm code) on the C=1 prompt, alternating with the engine, for the
C=1 comparison. Every side runs its llama.cpp calls on the engine's model thread (see
``main``). Figures are medians of ``--repeats`` runs; every figure is wall time from
submission to the last token (prefill included), the same for all sides.

    .venv/bin/python benchmarks/serving.py --compare-ceiling --compare-direct --json serving.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from llamacpp_multiseq_ceiling import Model, load_prompts, run_ceiling
from ruvllm.bench.machine import machine_info, machine_line
from ruvllm.config import load_config
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.plugins import get_registry
from ruvllm.registry import resolve
from ruvllm.types import GenerationParams
from ruvllm_llamacpp.kv_pool import FLASH_ATTN, flash_attn_enabled


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(round(q * (len(s) - 1)), len(s) - 1)]


async def run_engine(engine: ServingEngine, prompts: list[list[int]], max_tokens: int,
                     stream: bool = True) -> dict:
    """``stream``: read every token as it comes (TTFT by the client's clock); else await only
    the final result (TTFT from the engine's timings), so the event loop wakes once."""
    params = GenerationParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    handles = [await engine.submit(p, params) for p in prompts]

    async def consume(h):
        first = None
        if stream:
            async for out in h:
                if first is None and out.token_id is not None:
                    first = time.perf_counter()
        res = await h.result()
        if first is None:
            first = start + res.timings.time_to_first_token  # measured from arrival
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


class DirectSingle:
    """llama-cpp-python's high-level ``Llama`` on one stream: what a user calling it directly
    gets. Same GGUF, context size, threads and flash-attention setting as the engine."""

    def __init__(self, path: str, n_ctx: int, threads: int, flash_attn: bool):
        import llama_cpp

        self.llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                                   flash_attn=flash_attn, verbose=False)

    def run(self, prompt_ids: list[int], max_tokens: int) -> dict:
        self.llm.reset()  # full prefill, like the engine's isolated request
        out: list[int] = []
        start = time.perf_counter()
        first = start
        for token in self.llm.generate(prompt_ids, temp=0.0, reset=True):
            if not out:
                first = time.perf_counter()
            out.append(int(token))
            if len(out) == max_tokens:
                break
        end = time.perf_counter()
        return {"concurrency": 1, "output_tokens": len(out), "seconds": end - start,
                "output_tok_s": len(out) / (end - start), "ttft_p50": first - start,
                "ttft_p95": first - start, "tpot": (end - first) / max(len(out) - 1, 1), "outputs": [out]}

    def close(self) -> None:
        self.llm.close()


def sized(engine: ServingEngine, text: str, tokens: int) -> list[int]:
    """``text``'s tokens, or with ``tokens`` > 0, ``text`` repeated and cut to that many."""
    ids = engine.encode(text)
    if tokens:
        ids = engine.encode(" ".join([text] * (tokens // max(len(ids) - 1, 1) + 1)))[:tokens]
    return ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="llamacpp")
    ap.add_argument("--model", default="default")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n-ctx", type=int, default=512, help="context per sequence (llamacpp n_ctx)")
    ap.add_argument("--prompt-tokens", type=int, default=0,
                    help="prompts of exactly this many tokens (each bundled prompt repeated); "
                         "0: the bundled short prompts")
    ap.add_argument("--threads", type=int, default=None,
                    help="llama.cpp threads for the engine and the ceiling (default: the backend's)")
    ap.add_argument("--compare-ceiling", action="store_true",
                    help="also run llama.cpp's multi-sequence batch directly (llamacpp only)")
    ap.add_argument("--compare-direct", action="store_true",
                    help="also run llama-cpp-python's Llama.generate single stream at C=1 (llamacpp only)")
    ap.add_argument("--flash-attn", choices=FLASH_ATTN, default="auto",
                    help="the llamacpp flash_attn option, for every side (engine, ceiling, direct): "
                         "auto (the backend's default: on where several sequences share a context), "
                         "on or off")
    ap.add_argument("--consume", choices=("stream", "result"), default="stream",
                    help="read every streamed token (default) or await only each final result")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    config = load_config()
    source = resolve(args.model, config.cache_dir)
    backend_cls = get_registry().select(args.backend, source)
    opts: dict = {}
    if backend_cls.name == "llamacpp":
        opts["n_ctx"] = args.n_ctx
        opts["flash_attn"] = args.flash_attn
        if args.threads:
            opts["n_threads"] = args.threads
    threads = args.threads or len(os.sched_getaffinity(0))
    ceiling_model = Model(str(source.path), threads) if args.compare_ceiling else None
    direct = (DirectSingle(str(source.path), args.n_ctx, threads,
                           flash_attn_enabled(args.flash_attn, shared_pool=False, type_v="f16"))
              if args.compare_direct else None)

    rows = []
    path = "?"
    for c in args.concurrency:
        engine = ServingEngine(lambda: backend_cls.load(source, opts),
                               EngineOptions(max_num_seqs=c, max_queue=max(c, 256)))
        path = engine.path
        prompts = [sized(engine, p, args.prompt_tokens) for p in load_prompts(c)]
        engine.generate_sync([prompts[0]], GenerationParams(max_tokens=4))  # warm-up
        runs, ceil_runs, direct_runs = [], [], []
        for _ in range(args.repeats):
            runs.append(asyncio.run(run_engine(engine, prompts, args.max_tokens, args.consume == "stream")))
            # The other sides run on the engine's model thread too: llama.cpp's OpenMP team
            # belongs to the OS thread that calls it, and two threads taking turns (each with
            # its own team) ran every side 30-40 % slower here than one thread alone.
            if ceiling_model is not None:
                ceiling = partial(run_ceiling, ceiling_model, load_prompts(c), args.max_tokens, args.n_ctx,
                                  flash_attn=flash_attn_enabled(args.flash_attn, shared_pool=c > 1,
                                                                type_v="f16"))
                ceil_runs.append(engine.call(ceiling))
            if direct is not None and c == 1:
                direct_runs.append(engine.call(partial(direct.run, prompts[0], args.max_tokens)))
        engine.close()
        row = {"concurrency": c}
        for k in ("output_tok_s", "ttft_p50", "ttft_p95", "tpot"):
            row[k] = statistics.median(r[k] for r in runs)
            if ceil_runs:
                row[f"ceiling_{k}"] = statistics.median(r[k] for r in ceil_runs)
            if direct_runs:
                row[f"direct_{k}"] = statistics.median(r[k] for r in direct_runs)
        if ceil_runs:
            row["ratio"] = row["output_tok_s"] / row["ceiling_output_tok_s"]
            row["same_tokens_as_ceiling"] = runs[0]["outputs"] == ceil_runs[0]["outputs"]
        if direct_runs:
            row["direct_ratio"] = row["output_tok_s"] / row["direct_output_tok_s"]
            row["same_tokens_as_direct"] = runs[0]["outputs"] == direct_runs[0]["outputs"]
        rows.append(row)
        print(f"C={c}: {row}", file=sys.stderr)
    if ceiling_model is not None:
        ceiling_model.close()
    if direct is not None:
        direct.close()

    head = (f"{machine_line()}\nbackend {backend_cls.name} ({backend_cls.version() or '?'}), "
            f"engine path {path}; model {source.name}; {threads} llama.cpp threads; "
            f"{args.max_tokens} tokens/request, greedy, "
            f"flash_attn {args.flash_attn}, "
            f"EOS ignored; engine outputs consumed as {args.consume}; median of {args.repeats}")
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
    for r in rows:
        if "direct_ratio" in r:
            print(f"C=1 vs llama-cpp-python Llama.generate single stream: engine {r['output_tok_s']:.1f} / "
                  f"direct {r['direct_output_tok_s']:.1f} tok/s = {r['direct_ratio']:.2f} "
                  f"(TPOT {r['tpot'] * 1e3:.1f} / {r['direct_tpot'] * 1e3:.1f} ms, TTFT "
                  f"{r['ttft_p50'] * 1e3:.0f} / {r['direct_ttft_p50'] * 1e3:.0f} ms); "
                  f"same tokens: {r['same_tokens_as_direct']}")
    if args.json:
        args.json.write_text(json.dumps({"header": head, "machine": machine_info(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
