"""What SONA costs a server: the memory of one tenant's adapter, and serving throughput at C=16
while SONA learns against the same engine with SONA not learning (same run, same prompts)."""

from __future__ import annotations

import time

import attrs
from ruvllm.serving import Histogram
from ruvllm.types import GenerationParams
from ruvllm_sona import attach, detach
from ruvllm_sona.learner import Learner
from ruvllm_sona.options import SonaOptions
from sona_task import MAX_TOKENS, is_short

#: The throughput windows ``throughput`` serves, by the key prefix of its figures: what each means.
WINDOWS = {"frozen": "not learning", "deferred": "updates deferred", "concurrent": "updates beside serving"}


def adapter_bytes(learner: Learner) -> dict[str, int]:
    """Bytes of one tenant's served adapter (what an engine step with it reads) and of its training
    state (float32 masters, their gradients, Adam's two moments, EWC++'s Fisher and anchor)."""
    served = learner.backend.adapters.get(learner.name)
    served_bytes = 0 if served is None else sum(p.a.nbytes + p.b.nbytes for p in served.pairs.values())
    params = learner.micro.parameters()
    training = sum(p.nbytes for p in params)
    training += sum(p.grad.nbytes for p in params if p.grad is not None)
    training += sum(t.nbytes for st in learner.optimizer.state.values() for t in st.values() if t.dim())
    training += sum(t.nbytes for t in (*learner.ewc.fisher, *learner.ewc.anchor))
    return {"served": served_bytes, "training": training}


def _itl_p99_ms(before: Histogram, after: Histogram) -> float:
    """p99 inter-token latency of the tokens observed between two snapshots (the upper bound of
    the engine's histogram bucket holding it, so coarse: 40, 60, 80, 100, 150 ms...)."""
    counts = tuple(a - b for a, b in zip(after.counts, before.counts, strict=True))
    window = Histogram(buckets=after.buckets, counts=counts, sum=after.sum - before.sum,
                       count=after.count - before.count)
    return 1000 * window.quantile(0.99)


def _window(engine, prompts, n: int, seed: int, max_tokens: int) -> tuple[float, float]:
    """Serve ``n`` requests, all submitted at once (the engine runs 16 at a time), scoring each as it
    finishes (the feedback SONA learns from). Generated tokens per second, and the p99 inter-token
    latency in ms: an update beside serving may keep throughput and still stall steps."""
    itl_before = engine.metrics().inter_token_latency
    start = time.perf_counter()
    handles = [engine.submit_sync(prompts[i % len(prompts)], GenerationParams(
        max_tokens=max_tokens, temperature=0.8, seed=seed + i)) for i in range(n)]
    tokens = 0
    for h in handles:
        res = h.result()
        tokens += len(res.token_ids)
        engine.feedback(h.request_id, 1.0 if is_short(res, max_tokens) else 0.0)
    tok_s = tokens / (time.perf_counter() - start)
    return tok_s, _itl_p99_ms(itl_before, engine.metrics().inter_token_latency)


def throughput(engine, options: SonaOptions, prompts, n: int, seed: int = 777,
               max_tokens: int = MAX_TOKENS) -> dict:
    """Tokens/s at C=16 with SONA attached but not learning (no background thread), then learning
    as configured (its background loop waits up to ``defer_while_busy`` s for an idle engine), then
    learning with no wait (updates run beside serving). The same ``n`` prompts and seeds each time;
    each SONA is detached (its update in flight finished) before the next window."""
    out: dict = {"concurrency": engine.options.max_num_seqs, "requests": n}
    modes = {"frozen": None, "deferred": options.defer_while_busy, "concurrent": 0.0}
    for mode, defer in modes.items():
        opts = attrs.evolve(options, interval=0.5, min_feedback=8, defer_while_busy=defer or 0.0)
        sona = attach(engine, opts, start=defer is not None)
        try:
            out[f"{mode}_tok_s"], out[f"{mode}_itl_p99_ms"] = _window(engine, prompts, n, seed, max_tokens)
            out[f"{mode}_updates"] = sona.version
        finally:
            detach(engine)
            sona.reset()
    return out
