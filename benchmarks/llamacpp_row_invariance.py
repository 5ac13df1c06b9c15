"""When does a llama.cpp pool row give the same logits? One table per kernel setting.

The llama.cpp executor shares one unified KV pool between requests. Whether a request's logits
depend on what else is in the pool decides whether a repeated greedy request answers the same,
and it shaped how the engine runs ``flash_attn`` (docs/engine.md, "The llama.cpp executor").
This script measures it on the executor itself, with the embedded model: each case computes one
row two ways and prints the largest logit difference (0 means bit-identical).

- ``chunks``: a prompt prefilled at once vs in two chunks (split at its last whole block);
- ``prefix hit``: vs a second sequence sharing the first one's cells for the whole blocks and
  prefilling the rest (the engine's prefix cache);
- ``other cells``: vs the same prompt prefilled after other sequences took the low cells;
- ``16 neighbours``: a decode row alone vs among 16 other sequences' decode rows;
- ``next to a prefill``: a decode row alone vs in a step with another sequence's 200-token chunk;
- ``hole below``: decode rows when the sequence's new cells land in a hole below its prompt's
  cells (llama.cpp fills from the lowest free cell), vs in order.

``--n-ubatch`` sets the pool context's micro-batch (llama.cpp's ``n_ubatch``; by default the
whole step): below 64 rows llama.cpp's CPU flash attention never takes its tiled kernel.

    .venv/bin/python benchmarks/llamacpp_row_invariance.py --flash-attn off on
    .venv/bin/python benchmarks/llamacpp_row_invariance.py --flash-attn on --n-ubatch 63
    .venv/bin/python benchmarks/llamacpp_row_invariance.py --flash-attn on --type-v q8_0
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
from rich.console import Console
from rich.table import Table
from ruvllm.bench.machine import machine_line
from ruvllm.config import default_cache_dir
from ruvllm.executor import BatchEntry
from ruvllm.registry import resolve

TEXT = ("The river bends twice before it reaches the old stone bridge near the market. "
        "Engineers measured the load on each beam and wrote the numbers down. In winter the village "
        "library opens late, and children read by the warm stove. A careful cook tastes the soup. ") * 12
PROMPT = 150
BLOCK = 16


def entry(seq: int, tokens: list[int], start: int, sample: bool = True) -> BatchEntry:
    return BatchEntry(seq_id=seq, tokens=tokens, start_pos=start, sample=sample, block_table=[])


def with_n_ubatch(n_ubatch: int | None) -> None:
    """Give every multi-sequence llama.cpp context created from here on ``n_ubatch``."""
    if not n_ubatch:
        return
    import llama_cpp

    create = llama_cpp.llama_init_from_model

    def patched(model, cparams):
        if cparams.n_seq_max > 1:
            cparams.n_ubatch = n_ubatch
        return create(model, cparams)

    llama_cpp.llama_init_from_model = patched


def measure(backend, cases: dict[str, Callable]) -> dict[str, float]:
    out = {}
    for name, case in cases.items():
        ex = backend.create_executor(max_sequences=40, block_size=BLOCK)
        try:
            a, b = case(ex)
            out[name] = float(np.abs(np.asarray(a) - np.asarray(b)).max())
        finally:
            ex.close()
    return out


def cases(toks: list[int]) -> dict[str, Callable]:
    prompt, cut = toks[:PROMPT], (PROMPT - 1) // BLOCK * BLOCK

    def run(ex, *entries):
        return ex.execute(list(entries))

    def chunks(ex):
        whole = run(ex, entry(0, prompt, 0))[0]
        run(ex, entry(1, prompt[:cut], 0))
        return whole, run(ex, entry(1, prompt[cut:], cut))[0]

    def prefix_hit(ex):
        whole = run(ex, entry(0, prompt, 0))[0]
        ex.copy_prefix(0, 1, cut)
        return whole, run(ex, entry(1, prompt[cut:], cut))[0]

    def other_cells(ex):
        whole = run(ex, entry(0, prompt, 0))[0]
        run(ex, entry(1, toks[:300], 0, False))
        return whole, run(ex, entry(2, prompt, 0))[0]

    def decode_rows(ex, company: Callable[[], list[BatchEntry]]):
        run(ex, entry(0, prompt, 0))
        ex.copy_prefix(0, 1, PROMPT)
        alone = run(ex, entry(0, [toks[PROMPT]], PROMPT))[0]
        return alone, run(ex, entry(1, [toks[PROMPT]], PROMPT), *company())[0]

    def neighbours(ex):
        for s in range(2, 18):
            run(ex, entry(s, toks[s:s + 40], 0, False))
        return decode_rows(ex, lambda: [entry(s, [toks[s + 40]], 40) for s in range(2, 18)])

    def next_to_prefill(ex):
        return decode_rows(ex, lambda: [entry(2, toks[:200], 0)])

    def hole_below(ex):
        run(ex, entry(0, prompt, 0))
        in_order = [run(ex, entry(0, [toks[PROMPT + i]], PROMPT + i))[0] for i in range(4)]
        ex.free(0)
        run(ex, entry(1, toks[:PROMPT], 0, False))  # takes the low cells
        run(ex, entry(0, prompt, 0))                # the prompt above them
        ex.free(1)                                  # a hole below the prompt
        below = [run(ex, entry(0, [toks[PROMPT + i]], PROMPT + i))[0] for i in range(4)]
        return np.array(in_order), np.array(below)

    return {"chunks": chunks, "prefix hit": prefix_hit, "other cells": other_cells,
            "16 neighbours": neighbours, "next to a prefill": next_to_prefill, "hole below": hole_below}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flash-attn", nargs="+", default=["off", "on"], choices=("off", "on"))
    ap.add_argument("--n-ubatch", type=int, default=None)
    ap.add_argument("--type-v", default="f16", choices=("f16", "q8_0", "q4_0"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    with_n_ubatch(args.n_ubatch)
    import ruvllm_llamacpp

    console = Console(width=120)
    console.print(machine_line())
    source = resolve("default", default_cache_dir())
    table = Table(title=f"max |logit difference| of one row computed two ways (n_ubatch "
                        f"{args.n_ubatch or 'whole step'}, V {args.type_v}; 0 = bit-identical)")
    table.add_column("flash_attn")
    results = {}
    for fa in args.flash_attn:
        backend = ruvllm_llamacpp.LlamaCppBackend.load(
            source, {"n_threads": args.threads, "flash_attn": fa, "type_v": args.type_v,
                     "kv_budget_mib": 64})
        try:
            toks = backend.tokenizer.encode(TEXT)
            results[fa] = measure(backend, cases(toks))
        finally:
            backend.close()
    for name in next(iter(results.values())):
        table.add_column(name, justify="right")
    for fa, row in results.items():
        table.add_row(fa, *(f"{v:.3g}" for v in row.values()))
    console.print(table)


if __name__ == "__main__":
    main()
