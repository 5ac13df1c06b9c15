"""How much batching buys through the ServingEngine: C requests decoding together against one
alone, measured in back-to-back pairs in one process.

    .venv/bin/python benchmarks/batching_ratio.py --backend candle_like --option dtype=bfloat16

On a host whose speed drifts (memory bandwidth shared with other tenants), a single-stream run
and a C-request run taken minutes apart in separate processes can land in different
conditions, and their ratio inherits the drift. Here one engine (loaded on its model thread)
serves --rounds rounds of: one request alone, then a wave of C simultaneous requests. Each
round compares the two decode rates measured back to back (1 / ITL p50 and C / ITL p50: the
median gap between two tokens is a step in which every sequence decodes); the median over the
rounds is reported with every round's figures, and the JSON keeps the raw results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table
from ruvllm.bench.machine import machine_info, machine_line
from ruvllm.bench.prompts import prompt_ids
from ruvllm.bench.serving import EngineTarget, sweep
from ruvllm.config import load_config, parse_option
from ruvllm.engine import ServingEngine

RESULTS = Path(__file__).parent / "results" / "batching_ratio"


async def measure(args: argparse.Namespace, console: Console) -> list[dict]:
    config = load_config(overrides={"backend": args.backend},
                         backend_options=dict(parse_option(o) for o in args.option))
    engine = ServingEngine.from_config(config)
    try:
        prompts = [prompt_ids(engine.tokenizer, args.prompt_length, i) for i in range(args.concurrency)]
        target = EngineTarget(engine, prompts)
        rounds = []
        for r in range(args.rounds):
            alone, together = await sweep(
                target, [1, args.concurrency], num_requests=lambda c: c, max_tokens=args.gen_length,
                prompt_length=args.prompt_length, warmup=1 if r == 0 else 0,
            )
            single = 1 / alone["itl_s"]["p50"]
            batched = args.concurrency / together["itl_s"]["p50"]
            load = os.getloadavg()[0]
            rounds.append({"load_1m": load, "single_decode_tok_s": single,
                           "batched_decode_tok_s": batched, "ratio": batched / single,
                           "alone": alone, "together": together})
            console.print(f"round {r + 1}: alone {single:.1f} tok/s, {args.concurrency} together "
                          f"{batched:.1f} tok/s -> {batched / single:.2f}x (load {load:.2f})")
        return rounds
    finally:
        await engine.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="candle_like")
    ap.add_argument("--option", action="append", default=[], help="backend option KEY=VALUE (repeatable)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-length", type=int, default=128)
    ap.add_argument("--gen-length", type=int, default=64)
    args = ap.parse_args()
    console = Console(width=120)
    console.print(machine_line(), markup=False, highlight=False, soft_wrap=True)
    rounds = asyncio.run(measure(args, console))
    table = Table(title=f"{args.backend} {' '.join(args.option)}: decode tok/s through the ServingEngine, "
                        f"{args.prompt_length}-token prompts, {args.gen_length} tokens")
    for col in ("round", "alone", f"{args.concurrency} together", "ratio", "load"):
        table.add_column(col, justify="right")
    for i, r in enumerate(rounds, 1):
        table.add_row(str(i), f"{r['single_decode_tok_s']:.1f}", f"{r['batched_decode_tok_s']:.1f}",
                      f"{r['ratio']:.2f}x", f"{r['load_1m']:.2f}")
    median = {k: statistics.median(r[k] for r in rounds)
              for k in ("single_decode_tok_s", "batched_decode_tok_s", "ratio")}
    table.add_row("median", f"{median['single_decode_tok_s']:.1f}", f"{median['batched_decode_tok_s']:.1f}",
                  f"{median['ratio']:.2f}x", "")
    console.print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{args.backend}.json"
    out.write_text(json.dumps({"machine": machine_info(), "args": vars(args), "median": median,
                               "rounds": rounds}, indent=1))
    console.print(f"raw results: {out}")


if __name__ == "__main__":
    main()
