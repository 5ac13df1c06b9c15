"""Single-stream benchmark: one request at a time, the latency a lone user sees.

Every figure is measured on this run: TTFT and prefill from core's request timings, decode
rate from the tokens after the first, end-to-end latency by the wall clock around the request,
and peak RSS from the operating system.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs

from ruvllm.bench.prompts import prompt_ids
from ruvllm.bench.stats import summary
from ruvllm.llm import LLM
from ruvllm.types import GenerationParams


@attrs.frozen(kw_only=True)
class SingleStreamConfig:
    prompt_length: int = 128
    gen_length: int = 64
    warmup: int = 2
    iterations: int = 5

    def __attrs_post_init__(self) -> None:
        from ruvllm.errors import InvalidRequest

        for name in ("prompt_length", "gen_length", "iterations"):
            if getattr(self, name) < 1:
                raise InvalidRequest(name.replace("_", "-"), f"must be at least 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise InvalidRequest("warmup", f"must be >= 0, got {self.warmup}")


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def run_single_stream(llm: LLM, cfg: SingleStreamConfig,
                      progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Run ``warmup`` unrecorded then ``iterations`` recorded greedy requests of fixed length."""
    params = GenerationParams(max_tokens=cfg.gen_length, temperature=0.0, ignore_eos=True)
    runs = []
    total = cfg.warmup + cfg.iterations
    for i in range(total):
        ids = prompt_ids(llm.tokenizer, cfg.prompt_length, index=i)
        start = time.perf_counter()
        result = llm.generate(ids, params)
        e2e = time.perf_counter() - start
        if i >= cfg.warmup:
            t = result.timings
            runs.append({
                "prompt_tokens": result.usage.prompt_tokens,
                "output_tokens": result.usage.completion_tokens,
                "ttft_s": t.time_to_first_token,
                "prefill_tok_s": result.usage.prompt_tokens / t.prefill if t.prefill > 0 else 0.0,
                "decode_tok_s": result.decode_tokens_per_second,
                "e2e_s": e2e,
            })
        if progress is not None:
            progress("warmup" if i < cfg.warmup else "measure", i + 1, total)
    return {
        "mode": "single",
        "backend": llm.backend_name,
        "model": llm.model.name,
        "config": attrs.asdict(cfg),
        "runs": runs,
        "ttft_s": summary([r["ttft_s"] for r in runs]),
        "prefill_tok_s": summary([r["prefill_tok_s"] for r in runs]),
        "decode_tok_s": summary([r["decode_tok_s"] for r in runs]),
        "e2e_s": summary([r["e2e_s"] for r in runs]),
        "peak_rss_mb": round(peak_rss_bytes() / 2**20, 1),
    }
