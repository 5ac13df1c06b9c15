"""Predicted outputs (OpenAI's ``prediction``) against plain decoding, on one engine.

A prediction is per request, so one engine per backend (no ``speculative_method``) runs every
unit twice, back to back and in rotating order: without a prediction, and with the prediction a
client editing a file would send (the file as it is). Greedy, EOS honoured, timed from
submission to the last token (prefill included), C=1. Workloads, completions the embedded
SmolLM2-135M follows (it copies in a completion; it does not rewrite reliably in chat):

- ``rename``: return a function with its name changed (the output leaves the prediction at the
  new name and must find it again);
- ``strip``: the same function without its docstring (a cut in the middle);
- ``repeat``: repeat a paragraph (the whole answer predicted).

Each ratio is the median over repeats of the two runs' ratio in the same repeat, with its range;
"same tokens" says whether the outputs were identical (llama.cpp's batched verification may flip
a near-tie).

    .venv/bin/python benchmarks/predicted_outputs.py --backends llamacpp candle_like --repeats 5

Writes ``benchmarks/results/predicted_outputs.json`` and ``.md`` (or ``--json PATH``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ruvllm.bench.machine import machine_line
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.types import GenerationParams
from speculative import CODE, RESULTS, TEXT, engine_for

#: (prompt, predicted output): what a client asking for the edit knows of the answer.
WORKLOADS = {
    "rename": (f"Original code:\n```python\n{CODE}```\n\nThe same code with total_price renamed to "
               "order_total:\n```python\ndef order_total(", CODE),
    "strip": (f"Original code:\n```python\n{CODE}```\n\nThe same code with the docstring removed:\n"
              "```python\ndef total_price(", CODE),
    "repeat": (f"Repeat the following text exactly.\n\nText: {TEXT}\n\nRepeated text:", " " + TEXT),
}


def run(engine: ServingEngine, prompt: list[int], prediction: list[int], max_tokens: int) -> dict[str, Any]:
    params = GenerationParams(max_tokens=max_tokens, temperature=0.0)
    start = time.perf_counter()
    result = engine.submit_sync(prompt, params, prediction=prediction).result()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tok_s": len(result.token_ids) / seconds, "tokens": result.token_ids,
            "drafted": result.usage.draft_tokens, "accepted": result.usage.accepted_draft_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", nargs="+", default=["llamacpp", "candle_like"])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, help="llama.cpp threads (default: the backend's)")
    ap.add_argument("--json", default=str(RESULTS / "predicted_outputs.json"),
                    help="write every figure here (and a markdown table next to it)")
    args = ap.parse_args()
    print(machine_line())
    rows, record = [], {}
    for backend in args.backends:
        with engine_for(backend, EngineOptions(), args.threads) as engine:
            units = {w: (engine.encode(p), engine.encode(t, add_special=False))
                     for w, (p, t) in WORKLOADS.items() if w in args.workloads}
            run(engine, units[args.workloads[0]][0], [], 8)  # warm-up: threads, allocations
            runs: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {w: [] for w in units}
            for turn in range(args.repeats):
                for w, (prompt, predicted) in units.items():
                    order = [(), predicted] if turn % 2 == 0 else [predicted, ()]
                    done = {bool(p): run(engine, prompt, list(p), args.max_tokens) for p in order}
                    runs[w].append((done[False], done[True]))
                    print(f"{backend} {w}: plain {done[False]['tok_s']:.1f} tok/s, predicted "
                          f"{done[True]['tok_s']:.1f} tok/s, {done[True]['accepted']} of "
                          f"{done[True]['drafted']} drafted kept", file=sys.stderr, flush=True)
        for w, pairs in runs.items():
            paired = sorted(b["tok_s"] / a["tok_s"] for a, b in pairs)
            drafted = sum(b["drafted"] for _, b in pairs)
            accepted = sum(b["accepted"] for _, b in pairs)
            same = all(a["tokens"] == b["tokens"] for a, b in pairs)
            plain = statistics.median(a["tok_s"] for a, _ in pairs)
            predicted = statistics.median(b["tok_s"] for _, b in pairs)
            rows.append((backend, w, plain, predicted, statistics.median(paired), paired[0], paired[-1],
                         accepted, drafted, len(pairs[0][1]["tokens"]), same))
            record[f"{backend}/{w}"] = {"plain": [a["tok_s"] for a, _ in pairs],
                                        "predicted": [b["tok_s"] for _, b in pairs], "paired_ratios": paired,
                                        "drafted": drafted, "accepted": accepted, "same_tokens": same}
    header = ("| backend | workload | plain tok/s | predicted tok/s | ratio (paired median, range) | "
              "drafted tokens kept | tokens | same tokens |\n|---|---|---|---|---|---|---|---|")
    lines = [f"| {b} | {w} | {p:.1f} | {s:.1f} | {ratio:.2f}x ({low:.2f}-{high:.2f}) | "
             f"{f'{accepted / drafted:.0%} of {drafted}' if drafted else 'none drafted'} | {n} | "
             f"{'yes' if same else 'no'} |"
             for b, w, p, s, ratio, low, high, accepted, drafted, n, same in rows]
    table = "\n".join([header, *lines])
    print(table)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"machine": machine_line(), "argv": sys.argv[1:]}
    out.write_text(json.dumps({**meta, "results": record}, indent=1))
    out.with_suffix(".md").write_text(f"{meta['machine']}\n\n`{' '.join(sys.argv[1:])}`\n\n{table}\n")


if __name__ == "__main__":
    main()
