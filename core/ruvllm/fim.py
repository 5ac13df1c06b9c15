"""Fill-in-the-middle: a code model writes what goes between a prefix and a suffix.

Code models trained for it (StarCoder, Qwen2.5-Coder, DeepSeek-Coder and others) have three
control tokens, and the prompt is prefix-suffix-middle, as llama-server's ``/infill`` and
Ollama's templates build it: ``<prefix-token> prefix <suffix-token> suffix <middle-token>``; the
model then writes the middle, and its EOS (or a file separator) ends it. OpenAI's ``suffix`` on
``/v1/completions`` and Ollama's ``suffix`` on ``/api/generate`` ask for it; a model without
the tokens cannot, and is refused by name rather than given a prompt it was never trained on.

llama.cpp finds a GGUF's tokens itself (metadata, or the token texts it knows); a backend over
a Hugging Face tokenizer looks them up here by the texts of the families below.
"""

from __future__ import annotations

from collections.abc import Callable

from ruvllm.types import FimTokens

#: (prefix, suffix, middle) token texts of model families that fill in, prefix-suffix-middle.
KNOWN_FIM_TOKENS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, Qwen3-Coder
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder(2), SantaCoder, Granite code
    # DeepSeek-Coder: fullwidth vertical bars and the SentencePiece space, as its tokenizer spells them
    ("<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>", "<\uff5cfim\u2581end\uff5c>"),
)


def find_fim_tokens(token_id: Callable[[str], int | None]) -> FimTokens | None:
    """The model's fill-in-the-middle tokens, looked up by text (``token_id`` gives a token's id,
    or None when the vocabulary has no such token); None when no known family's three exist."""
    for texts in KNOWN_FIM_TOKENS:
        ids = [token_id(t) for t in texts]
        if all(i is not None for i in ids):
            prefix, suffix, middle = ids
            return FimTokens(prefix=prefix, suffix=suffix, middle=middle)  # type: ignore[arg-type]
    return None


def infill_ids(fim: FimTokens, head: list[int], prefix: list[int], suffix: list[int]) -> list[int]:
    """The prompt that asks for the middle: ``head`` (the BOS where the model wants one), then
    prefix-suffix-middle."""
    return [*head, fim.prefix, *prefix, fim.suffix, *suffix, fim.middle]
