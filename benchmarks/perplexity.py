"""Perplexity of held-out text under each backend's weights, side by side: is int4 as good as llama.cpp?

    .venv/bin/python benchmarks/perplexity.py
    .venv/bin/python benchmarks/perplexity.py --variant 'candle_like:dtype=bfloat16'
    .venv/bin/python benchmarks/perplexity.py --model /path/to/other.gguf

Issue 59 asks that candle_like's int4 path (the GGUF's Q4 codes on torch's packed int4 kernel)
score a held-out text within 1 % of llama.cpp's perplexity on the same GGUF. Every variant is a
real ServingEngine on the embedded model (one at a time, closed before the next loads) and scores
the same token ids through the engine's prompt logprobs (``GenerationParams(prompt_logprobs=0,
max_tokens=0)``: every prompt position's logprob of the token that follows, from the prefill
logits; what lm-eval's loglikelihood reads through ``echo``). Perplexity is
``exp(-mean logprob)`` over every scored token of every text.

The texts are the expository passages of benchmarks/sona_task.py (``GENERAL_TEXT`` and the
``VALIDATION_TEXTS``): written for this project, so in no model's training data. Defaults:
llamacpp as it serves; candle_like float32 dense (``int4_weights=false``: the blocks
dequantised); candle_like float32 on the GGUF's blocks with no dense copy (its default where the
native block kernel runs, torch's int4 kernel elsewhere), so that the prefill itself runs on them.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

from ruvllm.bench.machine import machine_line
from ruvllm.config import load_config, parse_option
from ruvllm.engine import ServingEngine
from ruvllm.types import GenerationParams
from sona_task import GENERAL_TEXT, VALIDATION_TEXTS

DEFAULT_VARIANTS = (
    "llamacpp:",
    "candle_like:dtype=float32,int4_weights=false",
    "candle_like:dtype=float32,int4_weights=true,dense_weights=false",
)


def parse_variant(spec: str) -> tuple[str, dict[str, Any]]:
    """``BACKEND:KEY=VALUE,KEY=VALUE`` -> the backend and its options, typed as ``-o`` types them."""
    backend, _, rest = spec.partition(":")
    return backend, dict(parse_option(item) for item in rest.split(",") if item)


def score(engine: ServingEngine, texts: list[list[int]]) -> tuple[float, int]:
    """Sum of the logprobs of every token after the first of each text, and their count."""
    total, count = 0.0, 0
    for ids in texts:
        result = engine.submit_sync(ids, GenerationParams(max_tokens=0, prompt_logprobs=0)).result()
        scored = [p.logprob for p in result.prompt_logprobs or () if p is not None]
        assert len(scored) == len(ids) - 1, (len(scored), len(ids))
        total += sum(scored)
        count += len(scored)
    return total, count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", help="BACKEND:KEY=VALUE,... (repeatable; default: "
                    + "; ".join(DEFAULT_VARIANTS) + ")")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="default",
                    help="a model reference or GGUF path (default: the embedded model)")
    a = ap.parse_args()
    print(machine_line())
    print(f"model: {a.model}")
    strings = [GENERAL_TEXT, *VALIDATION_TEXTS]
    rows = []
    ids_of_first: list[list[int]] | None = None
    for spec in a.variant or DEFAULT_VARIANTS:
        backend, options = parse_variant(spec)
        options.setdefault("n_threads", a.threads)
        config = load_config(overrides={"backend": backend, "model": a.model},
                             backend_options=options)
        start = time.perf_counter()
        engine = ServingEngine.from_config(config)
        try:
            ids = [engine.encode(s) for s in strings]
            if ids_of_first is None:
                ids_of_first = ids
            # Every variant must score the same tokens, or the perplexities do not compare.
            assert ids == ids_of_first, f"{spec} tokenizes the texts differently"
            total, count = score(engine, ids)
        finally:
            engine.close()
        ppl = math.exp(-total / count)
        rows.append((spec, ppl, count, time.perf_counter() - start))
        print(f"{spec:70s} perplexity {ppl:8.4f} over {count} tokens ({rows[-1][3]:.1f} s)", flush=True)
    base = rows[0][1]
    print(f"\n| variant | perplexity | vs {rows[0][0]} |\n|---|---|---|")
    for spec, ppl, _, _ in rows:
        print(f"| `{spec}` | {ppl:.4f} | {100 * (ppl / base - 1):+.2f} % |")


if __name__ == "__main__":
    main()
