"""Agreement with llama.cpp, the reference engine, measured teacher-forced.

Backends that compute on dequantized weights cannot reproduce llama.cpp bit for bit: llama.cpp
quantizes the *activations* to 8 bits inside its Q4_1/Q8_0 dot products and keeps K/V in
float16, which moves logits by up to ~1-2 on the embedded model, and llama.cpp disagrees with
itself by up to ~0.15 logit between its batched prefill and its token-by-token decode. Free-
running greedy output therefore diverges at the first near-tie, after which the two texts are
no longer comparable. So every position is compared *teacher-forced*: both engines see
llama.cpp's greedy prefix and we count where their top-1 agrees; wherever it does not, llama.cpp's
own margin between the two tokens says whether that was a near-tie (rounding may break it either
way) or a real error. The first disagreement of a prompt is also the length of the identical
free-running greedy prefix. A broken model (wrong RoPE, transposed weights, bad dequantization)
disagrees often and by large margins, so it fails both criteria at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import numpy as np

#: Eight varied prompts: prose, code, lists and chat turns in the model's template (ChatML for the
#: embedded SmolLM2), encoded with special tokens parsed.
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village,",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "List three primary colors:\n1.",
    "import numpy as np\nx = np.arange(10)\nprint(",
    "<|im_start|>user\nTranslate 'good morning' to French.<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox",
)

#: ``our_logits(sequence, first_row)`` -> float logits of rows ``first_row .. len(sequence)-1``.
LogitsFn = Callable[[list[int], int], np.ndarray]


@attrs.frozen
class Disagreement:
    prompt: int
    position: int
    want: int
    got: int
    #: llama.cpp's logit of its own choice minus its logit of ours (>= 0 up to its own noise).
    margin: float


@attrs.frozen
class ParityReport:
    agree: int
    total: int
    disagreements: tuple[Disagreement, ...]
    #: Per prompt: tokens generated identically before the first disagreement.
    identical_prefix: tuple[int, ...]

    @property
    def rate(self) -> float:
        return self.agree / self.total if self.total else 0.0

    def beyond(self, near_tie: float) -> list[Disagreement]:
        """Disagreements where llama.cpp was not near a tie: real errors."""
        return [d for d in self.disagreements if d.margin >= near_tie]

    def problems(self, *, expected_total: int, near_tie: float, min_rate: float) -> list[str]:
        """Why this report fails the parity criterion (empty when it passes)."""
        out = []
        if self.total != expected_total:
            out.append(f"compared {self.total} positions, expected {expected_total}")
        if far := self.beyond(near_tie):
            out.append(f"disagreements where llama.cpp was not near a tie (margin >= {near_tie}): {far}")
        if self.rate < min_rate:
            out.append(f"top-1 agreement {self.rate:.1%} is below {min_rate:.0%}")
        return out

    @property
    def widest_margin(self) -> float:
        return max((d.margin for d in self.disagreements), default=0.0)

    def summary(self) -> str:
        full = sum(1 for n in self.identical_prefix if n == self.total // len(self.identical_prefix))
        return (f"top-1 agreement {self.agree}/{self.total} ({self.rate:.1%}); widest llama.cpp margin at a "
                f"disagreement {self.widest_margin:.3f}; identical greedy prefix per prompt "
                f"{list(self.identical_prefix)} ({full} of {len(self.identical_prefix)} complete)")


class LlamaCppReference:
    """llama-cpp-python on one thread (its OpenMP workers crawl on a busy 2-core machine)."""

    def __init__(self, model_path: str | Path, *, n_ctx: int = 1024):
        import llama_cpp

        self._llm = llama_cpp.Llama(str(model_path), n_ctx=n_ctx, n_threads=1, logits_all=True,
                                    verbose=False)

    def greedy(self, ids: Sequence[int], n: int) -> list[int]:
        self._llm.reset()
        out: list[int] = []
        for token in self._llm.generate(list(ids), temp=0.0, top_k=1, repeat_penalty=1.0):
            out.append(token)
            if len(out) == n:
                break
        return out

    def logits(self, sequence: Sequence[int], first_row: int) -> np.ndarray:
        self._llm.reset()
        self._llm.eval(list(sequence))
        return np.array(self._llm.scores[first_row:len(sequence)])

    def close(self) -> None:
        self._llm.close()


def teacher_forced(reference: LlamaCppReference, prompts: Sequence[Sequence[int]], our_logits: LogitsFn,
                   tokens: int) -> ParityReport:
    """Compare ``tokens`` greedy positions per prompt, both sides fed llama.cpp's greedy prefix."""
    agree = total = 0
    disagreements: list[Disagreement] = []
    prefixes: list[int] = []
    for p, ids in enumerate(prompts):
        ref = reference.greedy(ids, tokens)
        sequence = [*ids, *ref[:-1]]
        first = len(ids) - 1
        ref_logits = reference.logits(sequence, first)
        ours = np.asarray(our_logits(sequence, first))
        prefix = None
        for i, want in enumerate(ref):
            got = int(ours[i].argmax())
            total += 1
            if got == want:
                agree += 1
                continue
            prefix = i if prefix is None else prefix
            margin = float(ref_logits[i][want] - ref_logits[i][got])
            disagreements.append(Disagreement(p, i, want, got, margin))
        prefixes.append(len(ref) if prefix is None else prefix)
    return ParityReport(agree, total, tuple(disagreements), tuple(prefixes))


def against_llama_cpp(model_path: str | Path, prompts: Sequence[Sequence[int]], our_logits: LogitsFn,
                      tokens: int) -> ParityReport:
    """:func:`teacher_forced` against a llama.cpp reference loaded from ``model_path``."""
    reference = LlamaCppReference(model_path)
    try:
        return teacher_forced(reference, prompts, our_logits, tokens)
    finally:
        reference.close()
