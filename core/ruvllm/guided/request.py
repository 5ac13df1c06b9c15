"""From a request's output constraint to the processors that enforce it.

The server's glue: a request takes one constraint, whether its own (a surface reads it from its
body's fields, ``response_format``, vLLM's ``structured_outputs``, Ollama's ``format``..., as a
:class:`~ruvllm.guided.grammar.GrammarSpec` naming that field) or an enforced ``tool_choice``'s
(they exclude each other, and a conflict is a 400 naming the field); whether the engine can
enforce it at all (only where core's sampler chooses the tokens); and one fresh processor per
choice under the serving engine's grammar engine (its ``guided_decoding_backend`` option),
compiled off the event loop.

The grammar engine is chosen per serving engine, not per request: vLLM's V0 took a request-level
``guided_decoding_backend``, and its V1 engine refuses one that differs from the server's, then
dropped the field; ruvllm follows V1.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import attrs

from ruvllm.errors import InvalidRequest
from ruvllm.generation import require_core_sampler
from ruvllm.guided.compile import GrammarCache
from ruvllm.guided.grammar import GrammarSpec
from ruvllm.guided.processor import GuidedProcessor
from ruvllm.guided.tools import ToolPlan, plan_tools
from ruvllm.serving import AsyncEngine


@attrs.frozen
class RequestConstraint:
    #: The grammar the output must match (None: unconstrained).
    spec: GrammarSpec | None = None
    #: What the request does with tools (mode ``none`` when it has none).
    tools: ToolPlan = attrs.field(factory=lambda: ToolPlan("none"))


def one_constraint(*specs: GrammarSpec | None) -> GrammarSpec | None:
    """The one output constraint among ``specs`` (None: none); a second is refused, naming it."""
    given = [s for s in specs if s is not None]
    if len(given) > 1:
        raise InvalidRequest(given[1].field, f"cannot be combined with {given[0].field}: "
                             "a request takes one output constraint")
    return given[0] if given else None


def chat_constraint(tools: Sequence[Any] | None, tool_choice: Any, parallel_tool_calls: bool | None,
                    grammar: GrammarSpec | None, chat_template: str | None) -> RequestConstraint:
    """The constraint of a chat: its tools' plan on ``chat_template``, and its one grammar (the
    tools' own, or the ``grammar`` the request set, which names the field it came from)."""
    plan = plan_tools(tools, tool_choice, parallel_tool_calls, chat_template)
    return RequestConstraint(one_constraint(plan.grammar, grammar), plan)


def check_engine(engine: AsyncEngine, spec: GrammarSpec) -> None:
    """Refuse, naming the field, where the engine's backend chooses tokens itself."""
    require_core_sampler(engine.path, engine.backend_name, spec.field, "constrained output")


def grammar_engine_of(engine: AsyncEngine) -> str:
    """The grammar engine the serving ``engine`` was configured with."""
    return engine.guided_decoding_backend


async def processors(engine: AsyncEngine, spec: GrammarSpec | None, n: int,
                     cache: GrammarCache | None = None) -> list[list[GuidedProcessor]]:
    """One processor list per choice (empty lists when unconstrained); compiles in a thread."""
    if spec is None:
        return [[] for _ in range(n)]
    check_engine(engine, spec)
    from ruvllm.guided import guided_processor

    tokenizer = engine.tokenizer
    grammar_engine = grammar_engine_of(engine)

    def build() -> list[list[GuidedProcessor]]:
        return [[guided_processor(spec, tokenizer, cache=cache, engine=grammar_engine)] for _ in range(n)]

    return await asyncio.to_thread(build)
