"""Speculative decoding (prompt lookup) against plain decoding, on the same prompts and engine options.

Three workloads, greedy, EOS honoured (both sides produce the same tokens, so tok/s compare the
same work), each timed from submission to the last token (prefill included):

- ``grounded``: C=1, completions that copy their input (repeat a text, return a function with
  one name changed, continue a list that repeats a template): SmolLM2-135M does not follow chat
  instructions to rewrite reliably, but it copies in a completion;
- ``chat``: C=1, free chat questions (little to copy: speculation must not cost);
- ``mixed16``: C=16, the grounded and chat prompts together (the batch threshold and the
  learnt cost of a drafted token decide).

For each backend, an engine without speculation and one with ``speculative_method = "ngram"``
(adaptive draft length, the engine's defaults otherwise) alternate ``--repeats`` times, each
loaded fresh on its own model thread; figures are medians, and the ratio is spec/plain.

    nice -n 10 .venv/bin/python benchmarks/speculative.py --backends llamacpp candle_like
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from ruvllm.bench.machine import machine_line
from ruvllm.chat import render_chat
from ruvllm.config import default_cache_dir
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.plugins import get_registry
from ruvllm.registry import resolve
from ruvllm.types import GenerationParams

TEXT = ("The river bends twice before it reaches the old stone bridge near the market. Engineers measured "
        "the load on each beam and wrote the numbers down. In winter the water freezes along the banks, "
        "and children skate from the mill to the church while their parents sell bread and cheese.")
CODE = '''def total_price(items, tax_rate, discount=0.0):
    """Return the price of an order: every item's price times its quantity, less the discount,
    plus tax at tax_rate."""
    subtotal = 0.0
    for item in items:
        if item.quantity <= 0:
            raise ValueError(f"item {item.name} has no quantity")
        subtotal += item.price * item.quantity
    subtotal -= subtotal * discount
    tax = subtotal * tax_rate
    return round(subtotal + tax, 2)
'''
#: Completions (no chat template) whose continuation copies the prompt.
GROUNDED = [
    f"Repeat the following text exactly.\n\nText: {TEXT}\n\nRepeated text:",
    f"Original code:\n```python\n{CODE}```\n\nThe same code with total_price renamed to order_total:\n"
    "```python\ndef order_total(",
    f"Original code:\n```python\n{CODE}```\n\nThe same code with the docstring removed:\n"
    "```python\ndef total_price(",
]
#: Chat questions (rendered with the model's chat template): free text, little to copy.
CHAT = ["Write a short story about a dragon who learns to bake.",
        "What are three tips for staying focused while studying?",
        "Describe your ideal weekend in a few sentences."]
WORKLOADS = {"grounded": (GROUNDED, 1), "chat": (CHAT, 1), "mixed16": (GROUNDED + CHAT, 16)}
BACKEND_OPTIONS = {"llamacpp": {"n_ctx": 2048}, "candle_like": {"dtype": "float32"}}


def prompt_ids(engine: ServingEngine, prompt: str) -> list[int]:
    if prompt in GROUNDED:
        return engine.encode(prompt)
    text = render_chat(engine.info.chat_template, [{"role": "user", "content": prompt}])
    return engine.encode(text, add_special=False, parse_special=True)


def run_workload(engine: ServingEngine, name: str, max_tokens: int) -> dict[str, Any]:
    questions, concurrency = WORKLOADS[name]
    prompts = [prompt_ids(engine, q) for q in questions]
    params = GenerationParams(max_tokens=max_tokens, temperature=0.0)
    before = engine.metrics()
    tokens, seconds, outputs = 0, 0.0, []
    if concurrency == 1:
        for p in prompts:
            start = time.perf_counter()
            result = engine.submit_sync(p, params).result()
            seconds += time.perf_counter() - start
            tokens += len(result.token_ids)
            outputs.append(result.token_ids)
    else:
        batch = [prompts[i % len(prompts)] for i in range(concurrency)]
        start = time.perf_counter()
        results = [h.result() for h in [engine.submit_sync(p, params) for p in batch]]
        seconds = time.perf_counter() - start
        tokens = sum(len(r.token_ids) for r in results)
        outputs = [r.token_ids for r in results]
    after = engine.metrics()
    drafted = after.spec_decode_draft_tokens - before.spec_decode_draft_tokens
    accepted = after.spec_decode_accepted_tokens - before.spec_decode_accepted_tokens
    return {"tok_s": tokens / seconds, "tokens": tokens, "drafted": drafted, "accepted": accepted,
            "outputs": outputs}


def engine_for(backend: str, options: EngineOptions, threads: int | None) -> ServingEngine:
    cls = get_registry().get(backend)
    opts = dict(BACKEND_OPTIONS.get(backend, {}))
    if threads and backend == "llamacpp":
        opts["n_threads"] = threads
    source = resolve("default", default_cache_dir())
    return ServingEngine(lambda: cls.load(source, opts), options)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", nargs="+", default=["llamacpp", "candle_like"])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, help="llama.cpp threads (default: the backend's)")
    ap.add_argument("--speculative-config", default='{"method": "ngram"}',
                    help="vLLM-style JSON for the speculative side (see docs/engine.md)")
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()
    from ruvllm.engine.options import speculative_config_options

    sides = {"plain": EngineOptions(),
             "spec": EngineOptions.from_mapping(speculative_config_options(args.speculative_config))}
    print(machine_line())
    rows, record = [], {}
    for backend in args.backends:
        figures: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for _ in range(args.repeats):
            for side, options in sides.items():
                with engine_for(backend, options, args.threads) as engine:
                    run_workload(engine, "chat", 8)  # warm-up: threads, allocations
                    for w in args.workloads:
                        figure = run_workload(engine, w, args.max_tokens)
                        figures.setdefault((side, w), []).append(figure)
                        print(f"{backend} {side} {w}: {figure['tok_s']:.1f} tok/s, {figure['accepted']} of "
                              f"{figure['drafted']} drafted tokens accepted", file=sys.stderr, flush=True)
        for w in args.workloads:
            plain, spec = figures[("plain", w)], figures[("spec", w)]
            p = statistics.median(r["tok_s"] for r in plain)
            s = statistics.median(r["tok_s"] for r in spec)
            drafted = sum(r["drafted"] for r in spec)
            accepted = sum(r["accepted"] for r in spec)
            same = all(a["outputs"] == b["outputs"] for a, b in zip(plain, spec, strict=True))
            rows.append((backend, w, p, s, s / p, accepted / drafted if drafted else 0.0, drafted, same))
            record[f"{backend}/{w}"] = {"plain": [r["tok_s"] for r in plain],
                                        "spec": [r["tok_s"] for r in spec], "drafted": drafted,
                                        "accepted": accepted, "same_tokens": same}
    print(f"{'backend':<12} {'workload':<9} {'plain tok/s':>11} {'spec tok/s':>10} {'ratio':>6} "
          f"{'accepted':>8} {'drafted':>7}  same tokens")
    for backend, w, p, s, ratio, rate, drafted, same in rows:
        print(f"{backend:<12} {w:<9} {p:>11.1f} {s:>10.1f} {ratio:>5.2f}x {rate:>8.0%} {drafted:>7}  "
              f"{'yes' if same else 'no'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_line(), "results": record}, f, indent=1)


if __name__ == "__main__":
    main()
