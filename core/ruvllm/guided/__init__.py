"""Constrained decoding in core: JSON schema / regex / Lark grammars and enforced tool calls.

One grammar per request (:mod:`ruvllm.guided.grammar`, :mod:`ruvllm.guided.tools`), compiled
once per (grammar, tokenizer) with a time limit (:mod:`ruvllm.guided.compile`), enforced by a
logits processor in core's sampler (:mod:`ruvllm.guided.processor`) whose masks the engine
computes for all constrained rows of a step together, beside the forward pass
(:mod:`ruvllm.guided.batch`). llguidance does the grammar work.
"""

from __future__ import annotations

from ruvllm.guided.compile import GrammarCache, default_cache
from ruvllm.guided.grammar import GrammarSpec, from_extensions, from_response_format, json_schema_grammar
from ruvllm.guided.processor import GuidedProcessor
from ruvllm.guided.tools import ToolCall, ToolPlan, plan_tools, split_tool_calls
from ruvllm.tokenizer import Tokenizer


def guided_processor(spec: GrammarSpec, tokenizer: Tokenizer, *,
                     cache: GrammarCache | None = None) -> GuidedProcessor:
    """A fresh processor enforcing ``spec`` for one request (blocking: compiles on a miss).
    Logits wider than the tokenizer's vocabulary (padded rows) are masked beyond it."""
    matcher = (cache or default_cache()).matcher(spec, tokenizer)
    return GuidedProcessor(matcher, tokenizer.vocab_size, tokenizer.eos_ids, kind=spec.kind)


__all__ = [
    "GrammarCache",
    "GrammarSpec",
    "GuidedProcessor",
    "ToolCall",
    "ToolPlan",
    "default_cache",
    "from_extensions",
    "from_response_format",
    "guided_processor",
    "json_schema_grammar",
    "plan_tools",
    "split_tool_calls",
]
