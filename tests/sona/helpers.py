"""What the SONA tests on the real engine share: the prompts' topics, a small training budget, and
sampled and greedy requests (optionally for a tenant)."""

from __future__ import annotations

import time

from ruvllm.types import GenerationParams

TOPICS = ["the sea", "a cat", "coffee", "winter"]
SAMPLE = dict(max_tokens=8, temperature=0.8)
#: Small training batches of short sequences (prompt tail + response) and few Fisher samples.
TRAIN = dict(interval=0, batch_size=4, fisher_batch=2, max_seq_len=40)


def serve(engine, prompts, seeds, **params):
    handles = [engine.submit_sync(p, GenerationParams(seed=s, **{**SAMPLE, **params})) for s in seeds
               for p in prompts]
    return [(h.request_id, h.result()) for h in handles]


def greedy(engine, ask, tenant: str | None = None):
    """The greedy tokens of two questions and each token's logprob, one request at a time (batch
    composition depends on arrival timing, bf16 results on it). Equal answers are equal in both,
    bit for bit; an adapter that applies shows in the logprobs even where the short greedy answer
    keeps its tokens (one update did not move a token on the Intel AMX kind's bf16 numerics)."""
    answers = []
    for topic in TOPICS[:2]:
        result = engine.submit_sync(ask(f"Write one short sentence about {topic}."),
                                    GenerationParams(max_tokens=12, tenant=tenant, logprobs=0)).result()
        answers.append((list(result.token_ids), [t.logprob for t in result.logprobs]))
    return answers


def wait_until(done, timeout: float) -> bool:
    """Poll ``done()`` until it is true or ``timeout`` seconds have passed, and return its last
    answer: SONA's background thread acts on its own schedule, so its tests wait for the effect
    rather than sleep a guess."""
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
    return done()


def wait_for_version(sona, version: int, timeout: float = 60.0) -> int:
    """SONA's version once its background thread has published ``version`` (each update,
    consolidation and reset counts one), or when ``timeout`` seconds have passed."""
    wait_until(lambda: sona.version >= version, timeout)
    return sona.version
