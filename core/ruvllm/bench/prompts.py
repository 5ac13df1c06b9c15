"""Benchmark prompts of an exact token length, built from ordinary English text.

:func:`prompt_ids` open with their number (``Document 1000.``, ``Document 1001.``), so two share
a head up to where their numbers differ (five tokens there): a cache of whole blocks (ruvllm's)
finds nothing of one in another, one that matches token by token (llama-server's) reuses that
head. :func:`fresh_prompts` share no first token, so no prefix cache can turn a serving benchmark
into a cache benchmark unless asked to.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from ruvllm.tokenizer import Tokenizer

_TEXT = (
    "The history of computing is a story of people trying to make machines do arithmetic faster. "
    "Early mechanical calculators added and multiplied with gears; later, relays and vacuum tubes "
    "replaced the gears, and transistors replaced the tubes. Each step made computers smaller, "
    "cheaper and more reliable, and each step changed what people expected them to do. "
    "Today a phone holds more computing power than the machines that guided the first moon landing, "
    "and the questions have moved from how to compute to what is worth computing at all. "
)


def prompt_ids(tokenizer: Tokenizer, length: int, index: int = 0) -> list[int]:
    """Token ids of a prompt exactly ``length`` tokens long, distinct for each ``index``."""
    head = f"Document {index}. "
    text = head + _TEXT
    ids = tokenizer.encode(text, add_special=True)
    while len(ids) < length:
        text += _TEXT
        ids = tokenizer.encode(text, add_special=True)
    return ids[:length]


#: A token that may open a prompt (:func:`fresh_prompts`): letters only, with or without the
#: leading space of a byte-level BPE's word tokens.
_HEAD_WORD = re.compile(r" ?[a-z]{4,}")


def _head_words(tokenizer: Tokenizer) -> Iterator[int]:
    """The vocabulary's tokens of letters only, in id order."""
    for token_id in range(tokenizer.vocab_size):
        if not tokenizer.is_special(token_id) and _HEAD_WORD.fullmatch(tokenizer.decode([token_id])):
            yield token_id


def fresh_prompts(tokenizer: Tokenizer, lengths: Sequence[int]) -> list[str]:
    """One prompt text for each of ``lengths`` (tokens as the tokenizer encodes the text, a BOS
    included where the model adds one, give or take one at the cut), no two opening with the same
    token: no prefix cache, llama-server's (token by token) or ruvllm's (block by block), reuses
    anything of one prompt for another.

    Prompt ``i`` opens with a token of letters of its own (the vocabulary's, in id order: ``ation
    history of computing...``), then a window over the benchmark text starting at one of its
    words, the ``i``-th modulo the words of the text, so that the bodies differ too. Raises
    ValueError when the vocabulary has fewer such tokens than ``lengths``.
    """
    if not lengths:
        return []
    if min(lengths) < 3:
        raise ValueError(f"prompts of at least 3 tokens, not {min(lengths)}")
    special = len(tokenizer.encode(" the")) - len(tokenizer.encode(" the", add_special=False))  # a BOS
    period = len(tokenizer.encode(_TEXT, add_special=False))
    text = _TEXT
    while len(ids := tokenizer.encode(text, add_special=False)) < 2 * period + max(lengths):
        text += _TEXT
    # Windows open at a word (a token with its leading space), so the head stays one token (a
    # tokenizer that decodes a lone token without its space: anywhere, the check below holds).
    starts = ([p for p in range(period, 2 * period) if tokenizer.decode([ids[p]]).startswith(" ")]
              or list(range(period, 2 * period)))
    heads = _head_words(tokenizer)
    prompts: list[str] = []
    for i, length in enumerate(lengths):
        start = starts[i % len(starts)]
        body = ids[start:start + length - special - 1]
        for head in heads:
            prompt = tokenizer.decode([head, *body])
            if tokenizer.encode(prompt, add_special=True)[special] == head:
                prompts.append(prompt)
                break
        else:
            raise ValueError(f"the vocabulary has words to open {len(prompts)} distinct prompts, "
                             f"not {len(lengths)}")
    return prompts


def fresh_prompt_ids(tokenizer: Tokenizer, length: int, count: int) -> list[list[int]]:
    """``count`` :func:`fresh_prompts` of ``length`` tokens, as token ids (BOS included where the
    model adds one), for an in-process engine."""
    return [tokenizer.encode(p) for p in fresh_prompts(tokenizer, [length] * count)]
