"""Speculative decoding (prompt lookup, draft model) against plain decoding, on the same prompts.

Three workloads, greedy, EOS honoured (the sides produce the same tokens up to near-ties, whose
flips llama.cpp's batch shapes cause: the table says whether they were identical), each timed
from submission to the last token (prefill included):

- ``grounded``: C=1, completions that copy their input (repeat a text, return a function with
  one name changed, continue a list that repeats a template): SmolLM2-135M does not follow chat
  instructions to rewrite reliably, but it copies in a completion;
- ``chat``: C=1, free chat questions (little to copy: speculation must not cost);
- ``mixed16``: C=16, the grounded and chat prompts together (the batch threshold and the
  learnt cost of a drafted token decide).

For each backend, an engine without speculation and one per ``--speculative-config`` (default
``{"method": "ngram"}``: adaptive draft length, the engine's defaults otherwise) are loaded side
by side, each on its own model thread, and run each unit of work (one prompt at C=1, the whole
batch at C=16) back to back, in rotating order, ``--repeats`` times: on a machine whose load
changes, every side meets the same load. Throughputs are medians; each ratio is the median over
repeats of that side over plain in the same repeat (with the range). A draft model naming the
target's own file runs as a second executor over the weights already loaded (the only
same-vocabulary model shipped here is the embedded one itself, so its figure shows what a draft
as costly as the target does).

    nice -n 10 .venv/bin/python benchmarks/speculative.py --backends llamacpp candle_like \
        --speculative-config '{"method": "ngram"}' \
        --speculative-config '{"method": "draft_model", "model": "default"}' \
        --speculative-config '{"method": "draft_model", "model": "default", "adaptive": false, \
                               "num_speculative_tokens": 4}'

Writes ``benchmarks/results/speculative.json`` and ``.md`` (or ``--json PATH``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
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
RESULTS = Path(__file__).resolve().parent / "results"


def prompt_ids(engine: ServingEngine, prompt: str) -> list[int]:
    if prompt in GROUNDED:
        return engine.encode(prompt)
    text = render_chat(engine.info.chat_template, [{"role": "user", "content": prompt}])
    return engine.encode(text, add_special=False, parse_special=True)


def units(engine: ServingEngine, name: str) -> list[list[list[int]]]:
    """The workload's timed units: each prompt alone (C=1), or all clients at once."""
    questions, concurrency = WORKLOADS[name]
    prompts = [prompt_ids(engine, q) for q in questions]
    if concurrency == 1:
        return [[p] for p in prompts]
    return [[prompts[i % len(prompts)] for i in range(concurrency)]]


def run_unit(engine: ServingEngine, batch: list[list[int]], max_tokens: int) -> dict[str, Any]:
    """``batch`` submitted at once, timed from submission to the last token."""
    params = GenerationParams(max_tokens=max_tokens, temperature=0.0)
    before = engine.metrics()
    start = time.perf_counter()
    results = [h.result() for h in [engine.submit_sync(p, params) for p in batch]]
    seconds = time.perf_counter() - start
    after = engine.metrics()
    return {"seconds": seconds, "tokens": sum(len(r.token_ids) for r in results),
            "drafted": after.spec_decode_draft_tokens - before.spec_decode_draft_tokens,
            "accepted": after.spec_decode_accepted_tokens - before.spec_decode_accepted_tokens,
            "outputs": [r.token_ids for r in results]}


def run_workload(engines: dict[str, ServingEngine], name: str, max_tokens: int, turn: int
                 ) -> dict[str, dict[str, Any]]:
    """Every side on every unit of the workload, the sides back to back per unit (their order
    rotating), so a change in the machine's load falls on all sides alike."""
    sides = list(engines)
    totals = {side: {"seconds": 0.0, "tokens": 0, "drafted": 0, "accepted": 0, "outputs": []}
              for side in sides}
    for i, batch in enumerate(units(engines[sides[0]], name)):
        k = (i + turn) % len(sides)
        for side in sides[k:] + sides[:k]:
            unit = run_unit(engines[side], batch, max_tokens)
            total = totals[side]
            for key in ("seconds", "tokens", "drafted", "accepted"):
                total[key] += unit[key]
            total["outputs"] += unit["outputs"]
    for total in totals.values():
        total["tok_s"] = total["tokens"] / total["seconds"]
    return totals


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
    ap.add_argument("--speculative-config", action="append",
                    help="vLLM-style JSON for one speculative side (repeatable; see docs/engine.md); "
                         'default {"method": "ngram"}')
    ap.add_argument("--json", default=str(RESULTS / "speculative.json"),
                    help="write every figure here (and a markdown table next to it)")
    args = ap.parse_args()
    from ruvllm.engine.options import speculative_config_options

    sides = {"plain": EngineOptions()}
    for text in args.speculative_config or ['{"method": "ngram"}']:
        options = EngineOptions.from_mapping(speculative_config_options(text))
        name = options.speculative_method + ("" if options.speculative_adaptive
                                             else f"-fixed{options.num_speculative_tokens}")
        sides[name] = options
    print(machine_line())
    rows, record = [], {}
    for backend in args.backends:
        figures: dict[tuple[str, str], list[dict[str, Any]]] = {}
        engines = {side: engine_for(backend, options, args.threads) for side, options in sides.items()}
        try:
            for engine in engines.values():
                run_unit(engine, units(engine, "chat")[0], 8)  # warm-up: threads, allocations
            for turn in range(args.repeats):
                for w in args.workloads:
                    for side, figure in run_workload(engines, w, args.max_tokens, turn).items():
                        figures.setdefault((side, w), []).append(figure)
                        print(f"{backend} {side} {w}: {figure['tok_s']:.1f} tok/s, {figure['accepted']} of "
                              f"{figure['drafted']} drafted tokens accepted", file=sys.stderr, flush=True)
        finally:
            for engine in engines.values():
                engine.close()
        for w in args.workloads:
            plain = figures[("plain", w)]
            p = statistics.median(r["tok_s"] for r in plain)
            for side in list(sides)[1:]:
                spec = figures[(side, w)]
                s = statistics.median(r["tok_s"] for r in spec)
                drafted = sum(r["drafted"] for r in spec)
                accepted = sum(r["accepted"] for r in spec)
                same = all(a["outputs"] == b["outputs"] for a, b in zip(plain, spec, strict=True))
                # Each repeat's two sides ran back to back per unit: their ratio is what a load
                # change spares, so the median of those ratios is the figure, with their range.
                paired = sorted(b["tok_s"] / a["tok_s"] for a, b in zip(plain, spec, strict=True))
                rows.append((backend, w, side, p, s, statistics.median(paired), paired[0], paired[-1],
                             accepted / drafted if drafted else 0.0, drafted, same))
                record[f"{backend}/{w}/{side}"] = {
                    "plain": [r["tok_s"] for r in plain], "spec": [r["tok_s"] for r in spec],
                    "paired_ratios": paired, "drafted": drafted, "accepted": accepted, "same_tokens": same}
    header = ("| backend | workload | method | plain tok/s | spec tok/s | ratio (paired median, range) | "
              "drafted tokens kept | same tokens |\n|---|---|---|---|---|---|---|---|")
    lines = [f"| {b} | {w} | {side} | {p:.1f} | {s:.1f} | {ratio:.2f}x ({low:.2f}-{high:.2f}) | "
             f"{f'{rate:.0%} of {drafted}' if drafted else 'none drafted'} | {'yes' if same else 'no'} |"
             for b, w, side, p, s, ratio, low, high, rate, drafted, same in rows]
    table = "\n".join([header, *lines])
    print(table)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"machine": machine_line(), "argv": sys.argv[1:], "sides": list(sides)}
    out.write_text(json.dumps({**meta, "results": record}, indent=1))
    out.with_suffix(".md").write_text(f"{meta['machine']}\n\n`{' '.join(sys.argv[1:])}`\n\n{table}\n")


if __name__ == "__main__":
    main()
