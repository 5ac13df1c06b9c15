"""Embeddings throughput (inputs/s) at batch 1 and 32, per backend, through the ServingEngine.

Each backend is loaded in a ServingEngine (the path ``/v1/embeddings`` takes: the batch runs on
the engine's model thread) and ``engine.embed`` is called on batches of the benchmark prompts
(benchmarks/serving_prompts.json, 5-15 tokens each). One run embeds at least ``--inputs`` inputs
after an untimed warm-up (which also creates llamacpp's embeddings context); the figure is the
median of ``--repeats`` runs, with the backends in a rotating order so none is always first.

    python benchmarks/embeddings.py --backends candle_like llamacpp --batch 1 32 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from ruvllm.bench.machine import machine_info, machine_line
from ruvllm.engine import ServingEngine

PROMPTS_FILE = Path(__file__).with_name("serving_prompts.json")


def backend_options(name: str, threads: int) -> dict:
    if name == "llamacpp":
        return {"n_threads": threads}
    if name == "candle_like":
        return {"n_threads": threads, "dtype": "float32"}
    return {}


def batches(engine: ServingEngine, size: int) -> list[list[int]]:
    prompts = json.loads(PROMPTS_FILE.read_text())
    return [engine.encode(prompts[i % len(prompts)]) for i in range(size)]


def run(engine: ServingEngine, batch: list[list[int]], inputs: int) -> float:
    """Inputs per second over at least ``inputs`` inputs."""
    done = 0
    start = time.perf_counter()
    while done < inputs:
        engine.embed(batch)
        done += len(batch)
    return done / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", nargs="+", default=["candle_like", "llamacpp"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--inputs", type=int, default=64, help="inputs embedded per timed run")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--model", default="default")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()

    from ruvllm.config import load_config

    engines = {}
    for name in args.backends:
        config = load_config(overrides={"backend": name, "model": args.model},
                             backend_options=backend_options(name, args.threads))
        engines[name] = ServingEngine.from_config(config)
    try:
        figures: dict[tuple[str, int], list[float]] = {(n, b): [] for n in engines for b in args.batch}
        data = {(n, b): batches(e, b) for n, e in engines.items() for b in args.batch}
        for (n, _), batch in data.items():
            engines[n].embed(batch)  # warm-up (kernels, llamacpp's embeddings context)
        names = list(engines)
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[: r % len(names)]:
                for b in args.batch:
                    figures[(name, b)].append(run(engines[name], data[(name, b)], max(args.inputs, b)))
        model = next(iter(engines.values())).info.name
    finally:
        for e in engines.values():
            e.close()

    print(machine_line())
    print(f"model {model}; threads {args.threads}; median of {args.repeats} runs of >= {args.inputs} inputs")
    rows = []
    for (name, b), values in figures.items():
        med = statistics.median(values)
        tokens = sum(len(x) for x in data[(name, b)])
        rows.append({"backend": name, "batch": b, "inputs_per_s": med, "tokens_per_batch": tokens,
                     "runs": values})
        print(f"{name:12s} batch {b:3d} ({tokens:4d} tokens): {med:8.1f} inputs/s   "
              f"runs: {' '.join(f'{v:.1f}' for v in values)}")
    for name in engines:
        if len(args.batch) > 1:
            lo, hi = min(args.batch), max(args.batch)
            ratio = statistics.median(figures[(name, hi)]) / statistics.median(figures[(name, lo)])
            print(f"{name}: batch {hi} / batch {lo} = {ratio:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
