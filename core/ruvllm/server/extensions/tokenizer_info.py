"""``GET /tokenizer_info``: what a client needs to tokenize like the served model (vLLM's endpoint).

lm-evaluation-harness's remote tokenizer reads ``bos_token``, ``eos_token``, ``pad_token`` and
``chat_template`` from it and tokenizes through ``/tokenize``, so scores are computed on exactly
the server's token ids without downloading the model's tokenizer from a hub.

Its one field is the query parameter ``model`` (:data:`QUERY_PARAMETERS`); the route refuses any
other by name, as unknown body fields are on every other endpoint.
"""

from __future__ import annotations

from typing import Any

from ruvllm.serving import AsyncEngine

#: The query parameters ``GET /tokenizer_info`` takes.
QUERY_PARAMETERS = frozenset({"model"})


def tokenizer_info(engine: AsyncEngine) -> dict[str, Any]:
    info = engine.info
    st = info.special_tokens
    tok = engine.tokenizer
    return {
        "tokenizer_class": type(tok).__name__,
        "bos_token": st.bos_text or None,
        "bos_token_id": st.bos_id,
        "eos_token": st.eos_text or None,
        "eos_token_id": st.eos_ids[0] if st.eos_ids else None,
        "eos_token_ids": list(st.eos_ids),
        "pad_token": tok.token_text(st.pad_id) if st.pad_id is not None else None,
        "pad_token_id": st.pad_id,
        "vocab_size": tok.vocab_size,
        "model_max_length": info.context_length,
        "chat_template": info.chat_template,
    }
