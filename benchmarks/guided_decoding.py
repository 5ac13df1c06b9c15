"""Constrained decoding cost: mask time per step at SmolLM2's 49k vocabulary, and C=16
aggregate throughput with every request json_schema-constrained vs unconstrained (one run,
side by side, on the real ServingEngine with the llamacpp backend and the embedded model).
``--engine`` picks the grammar engine (``guided_decoding_backend``): llguidance, xgrammar, or
both (one row each, same process, same engine instance).

Two unconstrained baselines, because a constrained request ends when its JSON is complete (its
own length, often below ``max_tokens``) while an unconstrained one at temperature 0.8 usually runs
to ``max_tokens``: the batch thins out sooner under the grammar, which lowers aggregate tok/s
for reasons that are not the grammar's cost. "free" runs every request to its natural end;
"same lengths" gives the i-th unconstrained request exactly the i-th constrained request's
token count (``ignore_eos``), so both runs have the same batch shape at every step and the
ratio measures what constraining costs.

    .venv/bin/python benchmarks/guided_decoding.py [--engine llguidance|xgrammar|both]
        [--concurrency 16] [--max-tokens 64] [--runs 3] [--mask-steps 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from ruvllm.config import load_config
from ruvllm.engine import ServingEngine
from ruvllm.guided import ENGINE_NAMES, guided_processor, json_schema_grammar
from ruvllm.hardware import cpu_info
from ruvllm.types import GenerationParams

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
    "city": {"type": "string", "maxLength": 40}},
    "required": ["name", "age", "tags", "city"], "additionalProperties": False}


def compile_cost(engine: ServingEngine, grammar_engine: str) -> float:
    """Milliseconds to compile the schema on a cold cache (vocabulary already built)."""
    from ruvllm.guided import GrammarCache

    spec = json_schema_grammar("bench", SCHEMA)
    guided_processor(spec, engine.tokenizer, engine=grammar_engine)  # vocabulary, import
    t0 = time.perf_counter()
    guided_processor(spec, engine.tokenizer, engine=grammar_engine, cache=GrammarCache())
    return (time.perf_counter() - t0) * 1e3


def mask_cost(engine: ServingEngine, grammar_engine: str, steps: int = 200) -> tuple[float, float]:
    """p50/p99 microseconds of one mask (one row's fill + apply to a logits row)."""

    spec = json_schema_grammar("bench", SCHEMA)
    tok = engine.tokenizer
    rng = np.random.default_rng(0)
    times = []
    done = 0
    while done < steps:
        proc = guided_processor(spec, tok, engine=grammar_engine)
        out: list[int] = []
        for _ in range(64):
            logits = rng.standard_normal(tok.vocab_size).astype(np.float32)
            t0 = time.perf_counter()
            masked = proc(out, logits)
            times.append(time.perf_counter() - t0)
            token = int(np.argmax(masked))
            if token in tok.eos_ids:
                break
            out.append(token)
            done += 1
    us = np.asarray(times) * 1e6
    return float(np.percentile(us, 50)), float(np.percentile(us, 99))


def batched_mask_cost(engine: ServingEngine, grammar_engine: str, rows: int = 16,
                      steps: int = 24) -> tuple[float, float]:
    """p50/p99 microseconds to fill the masks of ``rows`` constrained rows of one step together
    (what the engine runs beside the forward pass), sampling each row afterwards."""
    from ruvllm.guided.batch import start_step_masks
    from ruvllm.sampling import Sampler

    spec = json_schema_grammar("bench", SCHEMA)
    tok = engine.tokenizer
    rng = np.random.default_rng(1)
    params = GenerationParams(max_tokens=steps, temperature=0.8, seed=0)
    samplers = [Sampler(params, tok.vocab_size, (), [guided_processor(spec, tok, engine=grammar_engine)])
                for _ in range(rows)]
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        future = start_step_masks(samplers)
        assert future is not None
        future.result()
        times.append(time.perf_counter() - t0)
        for s in samplers:
            s.sample(rng.standard_normal(tok.vocab_size).astype(np.float32))
    us = np.asarray(times) * 1e6
    return float(np.percentile(us, 50)), float(np.percentile(us, 99))


def throughput(engine: ServingEngine, concurrency: int, max_tokens: int, grammar_engine: str | None,
               lengths: list[int] | None = None) -> tuple[float, list[int]]:
    """Aggregate tok/s of ``concurrency`` requests and each one's completion tokens. Constrained
    under ``grammar_engine`` (its JSON checked), or unconstrained (None); ``lengths`` gives each
    unconstrained request exactly that many tokens."""
    constrained = grammar_engine is not None
    prompt = engine.encode("Describe a person as JSON with name, age, tags and city.")
    spec = json_schema_grammar("bench", SCHEMA)
    procs = [[guided_processor(spec, engine.tokenizer, engine=grammar_engine)] if constrained else []
             for _ in range(concurrency)]
    params = [GenerationParams(max_tokens=lengths[i] if lengths else max_tokens, temperature=0.8,
                               seed=1 + i, ignore_eos=bool(lengths))
              for i in range(concurrency)]
    t0 = time.perf_counter()
    handles = [engine.submit_sync(prompt, params[i], logits_processors=procs[i]) for i in range(concurrency)]
    results = [h.result() for h in handles]
    elapsed = time.perf_counter() - t0
    if constrained:
        for r in results:
            if r.finish_reason.value == "stop":
                json.loads(r.text)
    counts = [r.usage.completion_tokens for r in results]
    if lengths:
        assert counts == lengths, (counts, lengths)
    return sum(counts) / elapsed, counts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=[*ENGINE_NAMES, "both"], default="llguidance",
                    help="grammar engine (guided_decoding_backend); both: one row each")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mask-steps", type=int, default=200, help="masks timed for the one-row figure")
    args = ap.parse_args()
    grammar_engines = list(ENGINE_NAMES) if args.engine == "both" else [args.engine]
    engine = ServingEngine.from_config(load_config(overrides={"backend": "llamacpp", "model": "default"}))
    try:
        print(f"machine: {json.dumps(cpu_info().as_dict())}")
        print(f"backend: {engine.backend_name}  model: {engine.info.name}  "
              f"vocab: {engine.tokenizer.vocab_size}")
        for name in grammar_engines:
            c = compile_cost(engine, name)
            p50, p99 = mask_cost(engine, name, args.mask_steps)
            b50, b99 = batched_mask_cost(engine, name, args.concurrency)
            print(f"[{name}] schema compile (cold cache) {c:.1f} ms; mask per step (fill + apply, one row): "
                  f"p50 {p50:.0f} us  p99 {p99:.0f} us; masks of {args.concurrency} rows filled together: "
                  f"p50 {b50:.0f} us  p99 {b99:.0f} us")
        for name in grammar_engines:
            throughput(engine, 2, 8, name)  # warm-up: compile cache, tokenizer table
        free: list[float] = []
        guided: dict[str, list[float]] = {name: [] for name in grammar_engines}
        matched: dict[str, list[float]] = {name: [] for name in grammar_engines}
        lengths: dict[str, list[list[int]]] = {name: [] for name in grammar_engines}
        for _ in range(args.runs):
            free.append(throughput(engine, args.concurrency, args.max_tokens, None)[0])
            for name in grammar_engines:
                tok_s, counts = throughput(engine, args.concurrency, args.max_tokens, name)
                guided[name].append(tok_s)
                lengths[name].append(counts)
                matched[name].append(throughput(engine, args.concurrency, args.max_tokens, None, counts)[0])
        f = statistics.median(free)
        print(f"C={args.concurrency} max_tokens={args.max_tokens}, median of {args.runs} runs: "
              f"unconstrained, free lengths {f:.1f} tok/s  per run: {[f'{x:.1f}' for x in free]}")
        for name, runs in guided.items():
            g, m = statistics.median(runs), statistics.median(matched[name])
            ratios = [a / b for a, b in zip(runs, matched[name], strict=True)]
            print(f"  json_schema [{name}] {g:.1f} tok/s  per run: {[f'{x:.1f}' for x in runs]}")
            print(f"    unconstrained with the same lengths {m:.1f} tok/s  per run: "
                  f"{[f'{x:.1f}' for x in matched[name]]}")
            print(f"    ratio constrained / same lengths: median {statistics.median(ratios):.2f}  "
                  f"per run: {[f'{x:.2f}' for x in ratios]};  constrained / free lengths: {g / f:.2f}")
            print(f"    constrained lengths (tokens) per run: "
                  f"{[f'mean {statistics.mean(c):.1f} min {min(c)} max {max(c)}' for c in lengths[name]]}")
    finally:
        engine.close()


if __name__ == "__main__":
    main()
