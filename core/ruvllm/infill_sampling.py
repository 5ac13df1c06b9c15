"""llama.cpp's fill-in-the-middle sampler ("infill"), which editors name in their ``/infill`` chain.

A code model filling a gap should stop as soon as the gap is plausibly filled, and should not
split its probability between tokens that spell the same text (``"retu"`` and ``"return"``).
llama.cpp's ``infill`` sampler, run after top-k and top-p, does both, and llama.vim and
llama.vscode ask for it (``samplers: ["top_k", "top_p", "infill"]``):

1. If the end tokens are probable enough (three times their mass, times the number of
   candidates, outweighs the text's), only the end tokens remain.
2. Otherwise a candidate whose text starts another's takes the other's probability (the more
   probable of the two keeps both), text candidates under 0.2 are dropped, and if none is left
   the answer ends; then those under ``1 / (kept + 1)`` are dropped too.

This is the same rule as llama.cpp's ``llama_sampler_infill_apply``, over the same candidates.
The merge compares every pair, so it looks at the :data:`MERGE_CANDIDATES` most probable text
candidates (editors cut to 40 with top-k first); a candidate further down would need to gather
0.2 of the mass from others below it to survive step 2.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np

#: How many of the most probable text candidates the prefix merge compares pairwise.
MERGE_CANDIDATES = 64
#: Text candidates below this probability (after the merge) are dropped, as in llama.cpp.
FIRST_THRESHOLD = 0.2


class InfillFilter:
    """Applies the infill rule to one step's candidates; one per request (it caches token texts)."""

    def __init__(self, end_ids: Collection[int], token_bytes: Callable[[int], bytes]):
        """``end_ids``: the tokens that end the answer (its EOS and stop tokens); ``token_bytes``: a
        token's text as bytes (empty for control tokens)."""
        self._end = np.asarray(sorted(end_ids), dtype=np.int64)
        self._bytes = token_bytes
        self._pieces: dict[int, bytes] = {}

    def _piece(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._bytes(token)
        return piece

    def __call__(self, ids: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The candidates ``ids`` with their unnormalised ``weights`` after the infill rule."""
        probs = weights.astype(np.float64) / weights.sum(dtype=np.float64)
        end = np.isin(ids, self._end)
        p_end = float(probs[end].sum())
        if 3 * p_end * len(ids) > 1.0 - p_end:
            return ids[end], probs[end] / p_end
        text = np.flatnonzero(~end)
        text = text[np.argsort(-probs[text], kind="stable")][:MERGE_CANDIDATES]
        merged = self._merge(ids, probs, text)
        kept = [k for k in text if merged[k] >= FIRST_THRESHOLD]
        if not kept:  # the answer ends (with ignore_eos nothing may end it: the likeliest text goes on)
            return (self._end[:1], np.ones(1)) if len(self._end) else (ids[text[:1]], np.ones(1))
        ends = np.flatnonzero(end)
        total = float(merged[kept].sum() + probs[ends].sum())
        threshold = 1.0 / (len(kept) + 1)
        kept = [k for k in kept if merged[k] / total >= threshold]
        keep = np.asarray([*kept, *ends], dtype=np.int64)
        out = merged[keep]
        return ids[keep], out / out.sum()

    def _merge(self, ids: np.ndarray, probs: np.ndarray, text: np.ndarray) -> np.ndarray:
        """``probs`` with each text candidate's mass moved to a candidate its text starts, or that
        starts it, whichever of the two is more probable (llama.cpp's pairwise order)."""
        merged = probs.copy()
        alive = dict.fromkeys(int(k) for k in text)
        pieces = {k: self._piece(int(ids[k])) for k in alive}
        for i0 in list(alive):
            for i1 in list(alive):
                if i0 not in alive:
                    break
                if i0 == i1 or i1 not in alive:
                    continue
                a, b = pieces[i0], pieces[i1]
                if a and len(a) <= len(b) and b.startswith(a):
                    dst, src = (i1, i0) if merged[i1] > merged[i0] else (i0, i1)
                    merged[dst] += merged[src]
                    merged[src] = 0.0
                    del alive[src]
        return merged
