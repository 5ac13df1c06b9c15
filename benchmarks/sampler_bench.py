"""Micro-benchmark of core's shared sampler (ruvllm.sampling.Sampler) on one logits row.

Every token of every request on every logits-producing backend goes through ``Sampler.sample``,
so its cost is added to each decode step. This prints the median per-call time, in
microseconds, for greedy, temperature, top-k, top-p, min-p and penalty settings on a
vocabulary the size of SmolLM2's (49152).

Two logits shapes are measured: "peaked", like a language model's real next-token
distribution (a handful of likely tokens over a long tail), and "flat", the worst case for
nucleus sampling (the top-p set spans most of the vocabulary, so the whole row is sorted).

    .venv/bin/python benchmarks/sampler_bench.py [--vocab 49152] [--calls 300] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from ruvllm.bench.machine import machine_line
from ruvllm.sampling import Sampler
from ruvllm.types import GenerationParams

CASES: list[tuple[str, dict]] = [
    ("greedy", {}),
    ("greedy + logprobs=5", {"logprobs": 5}),
    ("temperature=0.8 (full vocab)", {"temperature": 0.8}),
    ("top_k=40", {"temperature": 0.8, "top_k": 40}),
    ("top_p=0.9", {"temperature": 0.8, "top_p": 0.9}),
    ("min_p=0.05", {"temperature": 0.8, "min_p": 0.05}),
    ("penalties (rep 1.1, freq 0.5, pres 0.5), greedy",
     {"repetition_penalty": 1.1, "frequency_penalty": 0.5, "presence_penalty": 0.5}),
    ("typical chat: T=0.7 top_k=50 top_p=0.9 rep=1.1",
     {"temperature": 0.7, "top_k": 50, "top_p": 0.9, "repetition_penalty": 1.1}),
]


def logits_rows(vocab: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    peaked = rng.normal(0.0, 2.0, size=vocab).astype(np.float32)
    peaked[rng.choice(vocab, size=20, replace=False)] += rng.uniform(8.0, 14.0, size=20).astype(np.float32)
    flat = rng.normal(0.0, 0.01, size=vocab).astype(np.float32)
    return {"peaked": peaked, "flat": flat}


def time_case(params: GenerationParams, row: np.ndarray, calls: int, runs: int,
              prompt: list[int]) -> tuple[float, float]:
    """Medians over ``runs`` of the wall-clock and CPU microseconds per ``sample`` call.

    CPU time is printed too because this machine is shared: when other processes take the
    cores, wall time grows while the sampler's own CPU cost does not.
    """
    wall, cpu = [], []
    for _ in range(runs):
        sampler = Sampler(params, len(row), prompt_ids=prompt)
        sampler.sample(row)  # warm-up: first-call allocations
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(calls):
            sampler.sample(row)
        wall.append((time.perf_counter() - w0) / calls * 1e6)
        cpu.append((time.process_time() - c0) / calls * 1e6)
    return statistics.median(wall), statistics.median(cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--calls", type=int, default=300, help="sample() calls per run")
    parser.add_argument("--runs", type=int, default=5, help="runs per case; the median is printed")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    rows = logits_rows(args.vocab, rng)
    prompt = rng.integers(0, args.vocab, size=200).tolist()
    print(machine_line())
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}")
    print("backend: none (core sampler only, float32 logits); "
          f"model: synthetic logits, vocab {args.vocab}")
    print(f"median of {args.runs} runs x {args.calls} calls, microseconds per call (wall and CPU)\n")
    width = max(len(name) for name, _ in CASES)
    print(f"{'case':<{width}}  {'peaked wall':>11} {'cpu':>8}  {'flat wall':>11} {'cpu':>8}")
    for name, kwargs in CASES:
        params = GenerationParams(seed=0, **kwargs)
        (pw, pc), (fw, fc) = (time_case(params, rows[shape], args.calls, args.runs, prompt)
                              for shape in ("peaked", "flat"))
        print(f"{name:<{width}}  {pw:>11.1f} {pc:>8.1f}  {fw:>11.1f} {fc:>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
