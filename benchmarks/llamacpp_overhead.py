"""What ruvllm costs on top of llama.cpp: single-stream greedy decode, ruvllm vs llama-cpp-python.

Both sides run the same GGUF, prompt, thread count and context size in one process, on the
main thread, alternating run by run so that machine noise hits both alike:

- ``ruvllm``: ``LLM(backend="llamacpp").stream(...)`` (what ``ruvllm generate`` runs): core's
  sampler over a logits view, stop handling, incremental detokenization;
- ``llama-cpp-python``: ``Llama.generate(tokens, temp=0)``, its own greedy generation loop
  (the one ``create_completion`` drives), with a full prefill each run (``reset()``).

Both produce exactly ``--tokens`` tokens (EOS is ignored: ``ignore_eos`` for ruvllm, and
``Llama.generate`` does not stop by itself). Decode speed is (tokens - 1) / (time of the last
token - time of the first), i.e. prefill excluded; the greedy token ids of both must agree.

    .venv/bin/python benchmarks/llamacpp_overhead.py --tokens 128 --runs 5

Prints a table and writes JSON to benchmarks/results/. ``--profile`` adds a cProfile of one
ruvllm run (top functions by own time), to find per-token costs.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import llama_cpp
from ruvllm import LLM, GenerationParams
from ruvllm.bench.machine import machine_info, machine_line
from ruvllm.hardware import usable_cpus
from ruvllm.registry import embedded_model_path

RESULTS = Path(__file__).resolve().parent / "results"


def timed_tokens(tokens, n: int) -> tuple[list[int], float, float, float]:
    """Consume ``n`` token ids from an iterator; return them, start, first-token and end times."""
    start = time.perf_counter()
    out: list[int] = []
    first = 0.0
    for token in tokens:
        if not out:
            first = time.perf_counter()
        out.append(token)
        if len(out) == n:
            break
    return out, start, first, time.perf_counter()


def run_ruvllm(llm: LLM, prompt_ids: list[int], n: int) -> tuple[list[int], float, float, float]:
    params = GenerationParams(max_tokens=n, ignore_eos=True)
    stream = llm.stream(prompt_ids, params)
    return timed_tokens((out.token_id for out in stream if out.token_id is not None), n)


def run_direct(ref: llama_cpp.Llama, prompt_ids: list[int], n: int) -> tuple[list[int], float, float, float]:
    ref.reset()  # full prefill, like ruvllm's isolated call
    return timed_tokens(ref.generate(prompt_ids, temp=0.0, reset=True), n)


def measure(name: str, fn: Callable[[], tuple[list[int], float, float, float]], n: int) -> dict:
    ids, start, first, end = fn()
    if len(ids) != n:
        raise SystemExit(f"{name} produced {len(ids)} tokens instead of {n}")
    return {
        "ids": ids,
        "decode_tok_s": (n - 1) / (end - first),
        "total_tok_s": n / (end - start),
        "ttft_ms": (first - start) * 1000,
    }


def load_average() -> list[float] | None:
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(embedded_model_path()), help="GGUF file (default: embedded)")
    ap.add_argument("--prompt", default="Once upon a time, in a small village by the sea,")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5, help="measured runs per side (after one warm-up)")
    ap.add_argument("--n-threads", type=int, default=usable_cpus())
    ap.add_argument("--n-ctx", type=int, default=1024)
    ap.add_argument("--profile", action="store_true", help="cProfile one extra ruvllm run")
    args = ap.parse_args()

    llm = LLM(args.model, backend="llamacpp", options={"n_ctx": args.n_ctx, "n_threads": args.n_threads})
    ref = llama_cpp.Llama(args.model, n_ctx=llm.info.context_length, n_threads=args.n_threads,
                          n_threads_batch=args.n_threads, verbose=False)
    prompt_ids = llm.encode(args.prompt)
    sides: dict[str, Callable[[], tuple[list[int], float, float, float]]] = {
        "ruvllm": lambda: run_ruvllm(llm, prompt_ids, args.tokens),
        "llama-cpp-python": lambda: run_direct(ref, prompt_ids, args.tokens),
    }
    load_before = load_average()
    for fn in sides.values():  # warm-up: page in the weights, settle the thread pool
        fn()
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    for _ in range(args.runs):
        for name, fn in sides.items():
            runs[name].append(measure(name, fn, args.tokens))

    identical = runs["ruvllm"][0]["ids"] == runs["llama-cpp-python"][0]["ids"]
    summary = {
        name: {
            key: statistics.median(r[key] for r in results)
            for key in ("decode_tok_s", "total_tok_s", "ttft_ms")
        }
        for name, results in runs.items()
    }
    ratio = summary["ruvllm"]["decode_tok_s"] / summary["llama-cpp-python"]["decode_tok_s"]

    print(machine_line())
    print(f"model {Path(args.model).name}, prompt {len(prompt_ids)} tokens, {args.tokens} tokens "
          f"greedy, {args.runs} interleaved runs per side, n_threads {args.n_threads}, "
          f"n_ctx {llm.info.context_length}")
    print(f"Python {platform.python_version()}, llama-cpp-python {llama_cpp.__version__}, "
          f"load avg before {load_before}")
    print(f"{'side':<18} {'decode tok/s':>13} {'total tok/s':>12} {'TTFT ms':>9}   runs (decode tok/s)")
    for name, s in summary.items():
        per_run = " ".join(f"{r['decode_tok_s']:.1f}" for r in runs[name])
        print(f"{name:<18} {s['decode_tok_s']:>13.1f} {s['total_tok_s']:>12.1f} "
              f"{s['ttft_ms']:>9.1f}   {per_run}")
    print(f"ratio ruvllm / llama-cpp-python (median decode): {ratio:.3f}  "
          f"-> overhead {100 * (1 - ratio):+.1f} %; greedy tokens identical: {identical}")

    profile_text = None
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        run_ruvllm(llm, prompt_ids, args.tokens)
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
        profile_text = buf.getvalue()
        print(profile_text)

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"llamacpp_overhead-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({
        "benchmark": "llamacpp_overhead",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {**machine_info(), "load_avg_before": load_before, "load_avg_after": load_average()},
        "model": Path(args.model).name,
        "prompt_tokens": len(prompt_ids),
        "tokens": args.tokens,
        "runs": args.runs,
        "n_threads": args.n_threads,
        "n_ctx": llm.info.context_length,
        "median": summary,
        "per_run": {name: [{k: v for k, v in r.items() if k != "ids"} for r in results]
                    for name, results in runs.items()},
        "ratio_decode": ratio,
        "overhead_percent": 100 * (1 - ratio),
        "greedy_tokens_identical": identical,
        "profile": profile_text,
    }, indent=2))
    print(f"wrote {out}")
    llm.close()
    ref.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
