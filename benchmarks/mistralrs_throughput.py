"""mistral.rs aggregate decode throughput with 1, 4 and 16 requests in flight.

Each concurrency level starts N threads that each stream one greedy request through the
backend's request-level ``generate``; mistral.rs's scheduler batches the decode steps of the
requests it runs (``max_seqs``). Aggregate throughput = all completion tokens / wall time from
the first submit to the last token. Prompts differ per request.

    .venv/bin/python benchmarks/mistralrs_throughput.py --concurrency 1 4 16 --tokens 32 --runs 3

Prints the machine, model, settings and the median of --runs runs; every figure is measured.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import threading
import time

from ruvllm.registry import resolve
from ruvllm.types import GenerationParams
from ruvllm_mistralrs import MistralRsBackend

PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):", "Water boils at",
           "List three colors: red, green,", "In 1492, Columbus", "My favourite food is", "Hello",
           "The best way to learn a language is", "A recipe for pancakes:", "Dear Sir or Madam,",
           "The theory of relativity states", "import numpy as np\n", "Top 5 tourist sites in Rome:",
           "Photosynthesis is", "The weather today is"]


def one_level(backend: MistralRsBackend, n: int, tokens: int) -> tuple[float, float]:
    """(aggregate tok/s, median time to first token in s) for n concurrent requests."""
    params = GenerationParams(max_tokens=tokens, ignore_eos=True)
    counts = [0] * n
    ttft = [0.0] * n
    errors: list[BaseException] = []
    start = time.perf_counter()

    def worker(k: int) -> None:
        ids = backend.tokenizer.encode(PROMPTS[k % len(PROMPTS)] + f" ({k})")
        try:
            for i, _ in enumerate(backend.generate(ids, params)):
                if i == 0:
                    ttft[k] = time.perf_counter() - start
                counts[k] += 1
                if counts[k] >= tokens:
                    break
        except BaseException as exc:  # reported after the run
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} request(s) failed: {errors[0]!r}")
    return sum(counts) / elapsed, statistics.median(ttft)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="mistral.rs compute threads")
    ap.add_argument("--model", default="default", help="model reference (default: embedded GGUF)")
    ap.add_argument("--isq", default=None)
    ap.add_argument("--serial-prefill", default="auto", choices=["auto", "on", "off"])
    args = ap.parse_args()
    source = resolve(args.model, os.path.expanduser("~/.cache/ruvllm"))
    options = {"max_seqs": max(args.concurrency), "serial_prefill": args.serial_prefill}
    if args.threads:
        options["threads"] = args.threads
    if args.isq:
        options["isq"] = args.isq
    backend = MistralRsBackend.load(source, options)
    print(f"machine: {platform.machine()} {os.cpu_count()} cpus, {platform.platform()}, "
          f"load avg {os.getloadavg()[0]:.1f}")
    print(f"backend: mistralrs {MistralRsBackend.version()}, model {source.name} ({source.format}), "
          f"options {options}, serial prefill {backend.serial_prefill}")
    print(f"{args.tokens} greedy tokens per request, median of {args.runs} runs")
    try:
        one_level(backend, 1, 4)  # warm-up
        for n in args.concurrency:
            runs = [one_level(backend, n, args.tokens) for _ in range(args.runs)]
            tps = statistics.median(r[0] for r in runs)
            ttft = statistics.median(r[1] for r in runs)
            print(f"concurrency {n:3d}: {tps:7.1f} tok/s aggregate, median TTFT {ttft * 1000:7.0f} ms")
    finally:
        backend.close()


if __name__ == "__main__":
    main()
