"""Isolation under batching, judged so that legitimate batch numerics pass and every KV leak fails.

Exact token equality between a sequence run alone and the same sequence batched with 15 others
holds only for batch-invariant numerics. llama.cpp on an AVX2 CPU picks other matmul kernels by
batch size, bf16 kernels round differently per blocking, GPU kernels reduce in other orders: the
logits move by hundredths of a logit and a near-tie can flip. A free-running comparison then
diverges for good after that one flip and proves nothing either way.

So the batched run is *teacher-forced* on the solo run's tokens (a logits processor in core's
sampler forces each position), and every position compares the two logits rows, both computed on
the same context. A divergence (the batched row's top token differs from the solo token) is
allowed only where both hold:

- the solo run's top-2 margin at that position is below ``margin_bound`` (a near-tie that
  rounding may break either way), and
- the batched row stays within ``distance_bound`` (max |difference| over the vocabulary) of the
  solo row (the two runs computed the same thing up to rounding).

A leak (another sequence's KV attended to, stale KV after a free, a wrong row order, positions
that continue) changes the context the model sees, which moves logits by whole logits and flips
tokens far from any tie: it fails both conditions. Each failure names the position, both tokens
and both margins.

The bounds (``MARGIN_BOUND``, ``DISTANCE_BOUND``) are stated with what they were measured against
in docs/conformance.md. A backend whose KV storage itself moves logits (a KV cache quantised to 4
bits: what a position reads depends on whether its context came from the cache or from the same
step) needs wider ones; a conformance run of such a backend sets them for its process with
``RUVLLM_NEAR_TIE_BOUNDS=MARGIN,DISTANCE`` (``BOUNDS_ENV``), e.g. candle_like with
``kv_cache=two_tier`` (the figures are in docs/conformance.md, "The two-tier KV cache").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import attrs
import numpy as np

#: Solo top-2 margins below this are near-ties that rounding may break either way. Measured on
#: correct backends (16 prompts x 16 tokens, AVX-512 host): candle_like in bf16 flipped 4
#: positions, at solo margins under 0.2; llama.cpp, MLX and candle_like in fp32 flipped none.
MARGIN_BOUND = 0.5
#: Most a correct batched row may differ from its solo row anywhere in the vocabulary. Measured
#: (widest over 16 x 16 positions): llama.cpp 0.0 with AVX-512 kernels and 1.60 built for AVX2
#: only (its batched and solo matmul kernels differ there), MLX 0.0, candle_like fp32 0.011 and
#: bf16 1.19 (bf16 rounding of differently blocked matmuls). The candle_like mutant that attends
#: to stale padding KV failed at distances of 4.9-9.1.
DISTANCE_BOUND = 3.0
#: ``MARGIN,DISTANCE``: the bounds of every rule built without explicit ones in this process,
#: instead of MARGIN_BOUND and DISTANCE_BOUND. Each backend's conformance run is its own process
#: (tests/conformance/test_installed_backends.py), so this is one backend's (and options') bound.
BOUNDS_ENV = "RUVLLM_NEAR_TIE_BOUNDS"


def default_bounds() -> tuple[float, float]:
    """(margin bound, distance bound): ``BOUNDS_ENV`` when set, else the module's defaults."""
    text = os.environ.get(BOUNDS_ENV, "").strip()
    if not text:
        return MARGIN_BOUND, DISTANCE_BOUND
    try:
        margin, distance = (float(part) for part in text.split(","))
    except ValueError:
        margin = distance = float("nan")
    if not (margin > 0 and distance > 0):  # also refuses nan and a wrong count of parts
        raise ValueError(f"{BOUNDS_ENV}={text!r}: give two positive numbers MARGIN,DISTANCE "
                         f"(the defaults are {MARGIN_BOUND},{DISTANCE_BOUND})")
    return margin, distance


def top2_margin(row: np.ndarray, token: int) -> float:
    """``row[token]`` minus the best other logit (negative when ``token`` is not the top one)."""
    others = np.delete(np.asarray(row, dtype=np.float64), token)
    return float(row[token] - others.max()) if len(others) else float("inf")


class LogitsRecorder:
    """A logits processor that keeps a copy of every row it sees and changes nothing."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []

    def __call__(self, output_ids: Sequence[int], logits: np.ndarray) -> np.ndarray:
        self.rows.append(np.array(logits, dtype=np.float32, copy=True))
        return logits


class TeacherForcer(LogitsRecorder):
    """Records each row, then forces the next of ``tokens``: the request generates exactly
    ``tokens`` whatever its logits say, and the recorded rows are what the model computed on
    that forced context."""

    def __init__(self, tokens: Sequence[int]) -> None:
        super().__init__()
        self.tokens = tuple(int(t) for t in tokens)

    def __call__(self, output_ids: Sequence[int], logits: np.ndarray) -> np.ndarray:
        super().__call__(output_ids, logits)
        k = len(output_ids)
        if k >= len(self.tokens):
            return logits
        forced = np.full_like(logits, -np.inf)
        forced[self.tokens[k]] = 0.0
        return forced


@attrs.frozen(kw_only=True)
class Divergence:
    """One position where the compared row's top token is not the reference token."""

    position: int
    reference_token: int
    other_token: int
    #: The reference row's top-2 margin (its token over its runner-up).
    reference_margin: float
    #: How much the other row prefers its token over the reference token.
    other_margin: float
    #: max |other - reference| over the vocabulary.
    distance: float
    allowed: bool

    def describe(self, token_text: Callable[[int], str] = str) -> str:
        verdict = "allowed near-tie" if self.allowed else "NOT a near-tie"
        return (f"position {self.position}: {verdict}: batched chose {self.other_token} "
                f"{token_text(self.other_token)!r}, solo {self.reference_token} "
                f"{token_text(self.reference_token)!r}; solo top-2 margin {self.reference_margin:.3f}, "
                f"batched margin {self.other_margin:.3f}, max |logit diff| {self.distance:.3f}")


@attrs.frozen
class NearTieRule:
    """Where two computations of the same logits may legitimately pick different tokens.
    Bounds not given are :func:`default_bounds`'s."""

    margin_bound: float = attrs.field(factory=lambda: default_bounds()[0])
    distance_bound: float = attrs.field(factory=lambda: default_bounds()[1])

    def compare_row(self, position: int, reference: np.ndarray, other: np.ndarray,
                    reference_token: int | None = None) -> Divergence | None:
        """None when ``other``'s top token is the reference token (``reference``'s top one
        unless given), else the divergence, judged."""
        reference = np.asarray(reference, dtype=np.float32)
        other = np.asarray(other, dtype=np.float32)
        if reference.shape != other.shape:
            raise ValueError(f"position {position}: rows of different shapes {reference.shape} "
                             f"and {other.shape}")
        want = int(reference.argmax()) if reference_token is None else int(reference_token)
        got = int(other.argmax())
        if got == want:
            return None
        margin = top2_margin(reference, want)
        distance = float(np.abs(other.astype(np.float64) - reference).max())
        return Divergence(position=position, reference_token=want, other_token=got,
                          reference_margin=margin, other_margin=float(other[got] - other[want]),
                          distance=distance,
                          allowed=margin < self.margin_bound and distance < self.distance_bound)

    def compare(self, reference_tokens: Sequence[int], reference_rows: Sequence[np.ndarray],
                other_rows: Sequence[np.ndarray]) -> list[Divergence]:
        """Every divergence of a teacher-forced run from the reference run, position by position."""
        if not len(reference_rows) == len(other_rows) == len(reference_tokens):
            raise ValueError(f"{len(reference_tokens)} reference tokens, {len(reference_rows)} reference "
                             f"rows and {len(other_rows)} compared rows: the runs are not aligned")
        out = []
        for k, (token, ref, oth) in enumerate(zip(reference_tokens, reference_rows, other_rows, strict=True)):
            found = self.compare_row(k, ref, oth, token)
            if found is not None:
                out.append(found)
        return out


def max_distance(reference_rows: Sequence[np.ndarray], other_rows: Sequence[np.ndarray]) -> float:
    """Largest |difference| between aligned rows (reported so the bound's headroom is visible)."""
    return max((float(np.abs(np.asarray(o, np.float64) - np.asarray(r, np.float64)).max())
                for r, o in zip(reference_rows, other_rows, strict=True)), default=0.0)
