"""Benchmark prompts of an exact token length, built from ordinary English text.

Prompts differ from one another from their first words so no prefix cache can turn a serving
benchmark into a cache benchmark unless asked to.
"""

from __future__ import annotations

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


def prompt_text(tokenizer: Tokenizer, length: int, index: int = 0) -> str:
    """Text of roughly ``length`` tokens (for HTTP targets, which take text)."""
    ids = prompt_ids(tokenizer, length, index)
    bos = tokenizer.bos_id
    if ids and bos is not None and ids[0] == bos:
        ids = ids[1:]
    return tokenizer.decode(ids)
