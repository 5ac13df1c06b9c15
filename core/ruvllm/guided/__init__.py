"""Constrained decoding in core: JSON schema / regex / Lark grammars and enforced tool calls.

One grammar per request (:mod:`ruvllm.guided.grammar`, :mod:`ruvllm.guided.tools`), compiled
once per (engine, grammar, tokenizer) with a time limit (:mod:`ruvllm.guided.compile`), enforced
by a logits processor in core's sampler (:mod:`ruvllm.guided.processor`) whose masks the engine
computes for all constrained rows of a step together, beside the forward pass
(:mod:`ruvllm.guided.batch`). The grammar work is done by llguidance (default) or xgrammar,
selected by the ``guided_decoding_backend`` engine option (:mod:`ruvllm.guided.engine`).
"""

from __future__ import annotations

from ruvllm.guided.compile import GrammarCache, default_cache
from ruvllm.guided.engine import DEFAULT_ENGINE, ENGINE_NAMES, GrammarEngine, get_engine
from ruvllm.guided.grammar import GrammarSpec, from_extensions, from_response_format, json_schema_grammar
from ruvllm.guided.processor import GuidedProcessor
from ruvllm.guided.tools import ToolCall, ToolPlan, plan_tools, split_tool_calls
from ruvllm.tokenizer import Tokenizer


def guided_processor(spec: GrammarSpec, tokenizer: Tokenizer, *, cache: GrammarCache | None = None,
                     engine: GrammarEngine | str = DEFAULT_ENGINE) -> GuidedProcessor:
    """A fresh processor enforcing ``spec`` for one request under grammar ``engine`` (blocking:
    compiles on a miss). Logits wider than the tokenizer's vocabulary (padded rows) are masked
    beyond it."""
    eng = get_engine(engine) if isinstance(engine, str) else engine
    matcher = (cache or default_cache()).matcher(spec, tokenizer, eng)
    return GuidedProcessor(matcher, eng, tokenizer.vocab_size, tokenizer.eos_ids, kind=spec.kind,
                           recipe=spec)


__all__ = [
    "DEFAULT_ENGINE",
    "ENGINE_NAMES",
    "GrammarCache",
    "GrammarEngine",
    "GrammarSpec",
    "GuidedProcessor",
    "ToolCall",
    "ToolPlan",
    "default_cache",
    "from_extensions",
    "from_response_format",
    "get_engine",
    "guided_processor",
    "json_schema_grammar",
    "plan_tools",
    "split_tool_calls",
]
