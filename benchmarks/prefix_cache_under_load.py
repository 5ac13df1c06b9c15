"""Conversations that come back while long requests fill the KV pool: what the prefix cache kept.

Users chat while long requests (a long document summarised, say) take most of the pool. On the
llama.cpp executor a finished conversation is kept as a parked prefix donor, its KV in host
memory; the question is whether its next turn still finds it once the long requests have taken
the pool's blocks. This script runs the embedded model through the ServingEngine on llamacpp
with a small pool (``--kv-budget-mib``, so that the case stays quick; the default pool is 4x
larger and so are the requests that fill it):

1. ``--chats`` conversations, prompts of ``--chat-tokens`` tokens, answered one after another
   (``--answer`` new tokens each);
2. ``--long`` long requests (``--long-tokens`` of prompt, ``--long-new`` new tokens) submitted
   together; once they hold ``--fill`` of the pool, each conversation comes back, one after
   another, with its answer and a new question, while the long requests still run.

Printed: per returning conversation, the prompt tokens read from the cache (its usage's
``cached_prompt_tokens``) and the time to its first token, and the pool's use when it came.
Run it on two commits to compare them (``PYTHONPATH=<worktree>/core:<worktree>/plugins/llamacpp``).

    .venv/bin/python benchmarks/prefix_cache_under_load.py
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from llamacpp_multiseq_ceiling import load_prompts
from rich.console import Console
from rich.table import Table
from ruvllm.bench.machine import machine_line
from ruvllm.config import load_config
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.plugins import get_registry
from ruvllm.registry import resolve
from ruvllm.types import GenerationParams
from serving import sized


async def scenario(engine: ServingEngine, args: argparse.Namespace) -> list[dict]:
    texts = load_prompts(args.chats + args.long)
    chats = [sized(engine, t, args.chat_tokens) for t in texts[:args.chats]]
    answer = GenerationParams(max_tokens=args.answer, temperature=0.0, ignore_eos=True)
    turns = []
    for prompt in chats:  # the first turns, one after another: each ends as a cached prefix
        result = await (await engine.submit(prompt, answer)).result()
        turns.append(prompt + list(result.token_ids) + engine.encode(" And then?"))
    long_params = GenerationParams(max_tokens=args.long_new, temperature=0.0, ignore_eos=True)
    long_handles = [await engine.submit(sized(engine, t, args.long_tokens), long_params)
                    for t in texts[args.chats:]]
    capacity = engine.metrics().kv_capacity_tokens
    while engine.metrics().kv_used_tokens < args.fill * capacity:
        await asyncio.sleep(0.05)
    rows = []
    for n, prompt in enumerate(turns):  # the next turns, while the long requests run
        used, running = engine.metrics().kv_used_tokens, sum(not h.done for h in long_handles)
        result = await (await engine.submit(prompt, answer)).result()
        rows.append({"chat": n + 1, "prompt": len(prompt), "cached": result.usage.cached_prompt_tokens,
                     "ttft": result.timings.time_to_first_token, "pool_used": used / capacity,
                     "long_running": running})
    for h in long_handles:
        await h.result()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv-budget-mib", type=int, default=64)
    ap.add_argument("--chats", type=int, default=3)
    ap.add_argument("--chat-tokens", type=int, default=500)
    ap.add_argument("--answer", type=int, default=32)
    ap.add_argument("--long", type=int, default=2)
    ap.add_argument("--long-tokens", type=int, default=700)
    ap.add_argument("--long-new", type=int, default=500)
    ap.add_argument("--fill", type=float, default=0.75, help="share of the pool the long requests hold first")
    args = ap.parse_args()
    source = resolve("default", load_config().cache_dir)
    backend_cls = get_registry().select("llamacpp", source)
    opts = {"n_ctx": 0, "kv_budget_mib": args.kv_budget_mib}
    with ServingEngine(lambda: backend_cls.load(source, opts), EngineOptions(max_num_seqs=4)) as engine:
        rows = asyncio.run(scenario(engine, args))
        capacity = engine.metrics().kv_capacity_tokens
    table = Table(title=f"conversations back while {args.long} long requests run (pool {capacity} tokens)")
    for col in ("chat", "prompt tokens", "from the cache", "TTFT s", "pool in use when sent",
                "long requests running"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["chat"]), str(r["prompt"]), str(r["cached"]), f"{r['ttft']:.2f}",
                      f"{r['pool_used']:.0%}", str(r["long_running"]))
    out = Console()
    out.print(machine_line())
    out.print(table)
    out.print(f"cached {sum(r['cached'] for r in rows)} of {sum(r['prompt'] for r in rows)} prompt tokens; "
              f"TTFT median {statistics.median(r['ttft'] for r in rows):.2f} s")


if __name__ == "__main__":
    main()
