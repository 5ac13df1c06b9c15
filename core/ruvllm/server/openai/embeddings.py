"""OpenAI's embeddings list: how ``POST /v1/embeddings`` renders the lifecycle's vectors and token
counts (:class:`~ruvllm.server.lifecycle.embeddings.Embedded`).

``encoding_format: "base64"`` sends each vector's little-endian float32 bytes, as OpenAI does (and
as the ``openai`` client asks by default); ``"float"`` a list of floats.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from ruvllm.server.lifecycle.embeddings import Embedded


def encode_vector(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector.astype(np.float32).tolist()


def embeddings_response(embedded: Embedded, *, model: str, encoding_format: str) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": encode_vector(v, encoding_format)}
                 for i, v in enumerate(embedded.vectors)],
        "model": model,
        "usage": {"prompt_tokens": embedded.tokens, "total_tokens": embedded.tokens},
    }
