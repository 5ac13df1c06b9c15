"""How long a stream stalls while a large embeddings request runs beside it, through the ServingEngine.

A RAG indexer embedding thousands of documents shares the model thread with the chats streaming
beside it. One greedy stream of ``--tokens`` tokens runs alone, then again while ``--documents``
short documents are embedded in one ``embed_async`` call; the figures are the stream's longest
and median gap between two tokens in each run, and how long the embeddings took.

    python benchmarks/embeddings_beside_streams.py --backend llamacpp --documents 768
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from pathlib import Path

from ruvllm.bench.machine import machine_info, machine_line
from ruvllm.engine import ServingEngine
from ruvllm.types import GenerationParams


async def stream_gaps(engine: ServingEngine, prompt: list[int], tokens: int) -> list[float]:
    """Seconds between consecutive tokens of one greedy stream."""
    params = GenerationParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    handle = await engine.submit(prompt, params)
    times = [time.perf_counter() async for out in handle if out.token_id is not None]
    return [b - a for a, b in itertools.pairwise(times)]


async def measure(engine: ServingEngine, documents: list[list[int]], prompt: list[int],
                  tokens: int) -> dict[str, float]:
    alone = await stream_gaps(engine, prompt, tokens)
    stream = asyncio.ensure_future(stream_gaps(engine, prompt, tokens))
    await asyncio.sleep(0.3)  # the stream is decoding
    start = time.perf_counter()
    await engine.embed_async(documents)
    embed_s = time.perf_counter() - start
    beside = await stream
    return {"alone_max_gap_s": max(alone), "alone_median_gap_s": statistics.median(alone),
            "beside_max_gap_s": max(beside), "beside_median_gap_s": statistics.median(beside),
            "embeddings_s": embed_s, "embedded_tokens": sum(map(len, documents))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="llamacpp")
    ap.add_argument("--model", default="default")
    ap.add_argument("--documents", type=int, default=768)
    ap.add_argument("--tokens", type=int, default=120, help="tokens the stream generates")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()

    from ruvllm.config import load_config

    engine = ServingEngine.from_config(load_config(overrides={"backend": args.backend, "model": args.model}))
    try:
        documents = [engine.encode(f"Document number {i} talks about topic {i % 17} in some detail.")
                     for i in range(args.documents)]
        prompt = engine.encode("Once upon a time")
        engine.embed(documents[:8])  # warm-up (kernels, llamacpp's embeddings context)
        figures = asyncio.run(measure(engine, documents, prompt, args.tokens))
        budget = engine.options.max_batch_tokens
    finally:
        engine.close()

    print(machine_line())
    print(f"{args.backend}: a {args.tokens}-token stream beside {args.documents} documents "
          f"({figures['embedded_tokens']} tokens, embedded in batches of <= {budget} tokens, "
          f"{figures['embeddings_s']:.1f} s)")
    print(f"  alone:  longest gap {figures['alone_max_gap_s'] * 1000:7.0f} ms, "
          f"median {figures['alone_median_gap_s'] * 1000:5.0f} ms")
    print(f"  beside: longest gap {figures['beside_max_gap_s'] * 1000:7.0f} ms, "
          f"median {figures['beside_median_gap_s'] * 1000:5.0f} ms")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "backend": args.backend,
                                         "max_batch_tokens": budget, **figures}, indent=2))


if __name__ == "__main__":
    main()
