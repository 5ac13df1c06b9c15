"""Predicted outputs: draft a request's tokens from the answer its client expects.

OpenAI's ``prediction`` (Predicted Outputs): a client that knows most of the answer (a file it
asks the model to edit, a document to reformat) sends it along, and the tokens that match are
verified in one forward pass instead of being decoded one by one. The answer is what the model
would have written anyway: a prediction only drafts, and the request's own sampler decides
(:meth:`ruvllm.engine.executor_core.ExecutorCore._verify`).

The output is followed through the prediction with a cursor: while the sampled tokens equal the
predicted ones the cursor moves on and the next tokens are drafted; where the model writes
something else (an edit) the cursor is lost, and found again where the output's last tokens
occur in the prediction (the first occurrence after where it was lost, else the last one before),
which is where the unchanged text resumes.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Occurrences of the output's tail compared when finding the cursor again.
MAX_CANDIDATES = 64


class PredictionCursor:
    """One request's position in its predicted output."""

    def __init__(self, prediction: Sequence[int], min_n: int, max_n: int):
        self.prediction = tuple(prediction)
        self.min_n = min_n
        self.max_n = max_n
        #: Where the next output token is expected in the prediction (None: lost).
        self._at: int | None = 0
        #: The last position the cursor held, where the search resumes from.
        self._last = 0
        #: Output tokens already followed.
        self._seen = 0
        #: ``min_n``-gram -> positions just after each of its occurrences in the prediction.
        self._after: dict[tuple[int, ...], list[int]] = {}
        for end in range(min_n, len(self.prediction) + 1):
            self._after.setdefault(self.prediction[end - min_n:end], []).append(end)

    def propose(self, output: Sequence[int], k: int) -> tuple[int, ...]:
        """Up to ``k`` predicted tokens to follow ``output`` (the request's tokens so far, which
        only grow between calls); empty where the output left the prediction for now."""
        self._follow(output)
        if self._at is None:
            self._at = self._find(output)
        if self._at is None or k < 1:
            return ()
        return self.prediction[self._at:self._at + k]

    def _follow(self, output: Sequence[int]) -> None:
        predicted = self.prediction
        for token in output[self._seen:]:
            if self._at is not None and self._at < len(predicted) and predicted[self._at] == token:
                self._at += 1
                self._last = self._at
            else:
                self._at = None
        self._seen = len(output)

    def _find(self, output: Sequence[int]) -> int | None:
        """Just after the longest tail of ``output`` (``min_n`` to ``max_n`` tokens) found in the
        prediction: the first occurrence from where the cursor was lost, else the last before."""
        end = len(output)
        if end < self.min_n:
            return None
        candidates = self._after.get(tuple(output[end - self.min_n:]), ())
        if not candidates:
            return None
        ahead = [p for p in candidates if p >= self._last][:MAX_CANDIDATES]
        behind = [p for p in reversed(candidates) if p < self._last][:MAX_CANDIDATES]
        best, best_len = None, 0
        for p in (*ahead, *behind):
            n = self.min_n
            while n < self.max_n and p - n - 1 >= 0 and end - n - 1 >= 0 \
                    and self.prediction[p - n - 1] == output[end - n - 1]:
                n += 1
            if n > best_len:
                best, best_len = p, n
                if n == self.max_n:
                    break
        return best
