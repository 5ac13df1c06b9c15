"""What every embeddings backend shares: input checks and the final L2 normalisation.

Backends pool hidden states their own way (a padded torch batch, a llama.cpp embeddings
context) but must refuse the same inputs with the same errors and return unit vectors, so a
client sees one behaviour whichever engine serves the model (``LlmBackend.embed_batch``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ruvllm.errors import InvalidRequest
from ruvllm.tokenizer import require_in_vocabulary


def check_embedding_inputs(inputs: Sequence[Sequence[int]], *, vocab_size: int, max_tokens: int,
                           field: str = "input") -> list[list[int]]:
    """``inputs`` as lists of ints, or :class:`InvalidRequest` naming the first bad one.

    Over-long inputs are refused rather than truncated: a vector of a silently cut text would
    be a wrong answer that looks right.
    """
    if not inputs:
        raise InvalidRequest(field, "must hold at least one input")
    out: list[list[int]] = []
    for i, ids in enumerate(inputs):
        name = f"{field}[{i}]" if len(inputs) > 1 else field
        if isinstance(ids, (str, bytes)) or not all(_is_token_id(t) for t in ids):
            raise InvalidRequest(name, "must be a list of token ids (integers); encode text with the "
                                 "model's tokenizer first (engine.encode)", type(ids).__name__)
        ids = [int(t) for t in ids]
        if not ids:
            raise InvalidRequest(name, "is empty; every input needs at least one token")
        if len(ids) > max_tokens:
            raise InvalidRequest(name, f"has {len(ids)} tokens, but this model embeds at most {max_tokens} "
                                 "tokens per input; shorten or split it", len(ids))
        require_in_vocabulary(name, ids, vocab_size)
        out.append(ids)
    return out


def _is_token_id(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def normalise_rows(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled to unit L2 norm, as float32 (a zero row stays zero rather than NaN)."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.where(norms > 0, norms, 1.0)


def token_chunks(inputs: list[list[int]], budget: int) -> list[list[list[int]]]:
    """``inputs`` in order, cut into runs of at most ``budget`` tokens (an input longer than the
    budget is a run of its own): the embedding work one model-thread call does."""
    chunks: list[list[list[int]]] = []
    tokens = budget
    for ids in inputs:
        if tokens + len(ids) > budget:
            chunks.append([])
            tokens = 0
        chunks[-1].append(ids)
        tokens += len(ids)
    return chunks
