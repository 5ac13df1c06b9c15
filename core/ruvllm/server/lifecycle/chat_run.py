"""One chat request from its body to a running submission: the part every API surface shares.

OpenAI's ``/v1/chat/completions`` and Anthropic's ``/v1/messages`` differ in their JSON, not in
what happens to a conversation: the prompt is the model's chat template over the messages (tools
taught where the template cannot render them), the parameters are checked against the server's
limits and the model's context, the grammar (tools, structured output) is compiled, and every
choice is submitted through the :class:`~ruvllm.server.lifecycle.completion_service.CompletionService`.
A surface translates its body into a neutral :class:`~ruvllm.server.lifecycle.request_input.ChatInput`
(OpenAI's chat as every other: no surface's schema is the lifecycle's) and renders what comes
back, read as neutral events (:mod:`ruvllm.server.lifecycle.answer_events`: the thinking split
off, tool calls read out, logprobs looked up); everything in between is here, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ruvllm.errors import InvalidRequest
from ruvllm.guided.request import RequestConstraint, chat_constraint
from ruvllm.guided.request import processors as guided_processors
from ruvllm.reasoning import Reasoning, reasoning_for
from ruvllm.server.lifecycle.answer_events import AnswerEvents
from ruvllm.server.lifecycle.completion_service import ChoiceRequest, CompletionService, Submission
from ruvllm.server.lifecycle.model_pool import Route
from ruvllm.server.lifecycle.params import Limits, chat_prompt_ids, prediction_ids, seeded, truncated
from ruvllm.server.lifecycle.request_input import ChatInput
from ruvllm.server.lifecycle.scheduling import submit_options


@attrs.frozen
class ChatRun:
    submission: Submission
    #: How the choices' outputs are read as events (thinking, tool calls, logprobs).
    reading: AnswerEvents
    prompt_ids: list[int]
    #: The request sent a predicted output, which drafted for it (OpenAI's usage reports it).
    predicted: bool = False


async def chat_prompt(route: Route, chat: ChatInput) -> list[int]:
    """The prompt's token ids, as :func:`start_chat` would run them (count_tokens, tokenize)."""
    return (await _constrained_prompt(route, chat))[1]


async def _constrained_prompt(route: Route, chat: ChatInput) -> tuple[RequestConstraint, list[int]]:
    constraint = chat_constraint(chat.tools, chat.tool_choice, chat.parallel_tool_calls, chat.grammar,
                                 route.engine.info.chat_template)
    options = chat.template
    ids = truncated(await chat_prompt_ids(route.engine, chat.messages, constraint.tools, options),
                    chat.truncate_prompt_tokens, chat.truncation_side, route.engine.info.context_length)
    if constraint.spec is not None and options.continues([dict(m) for m in chat.messages]):
        raise InvalidRequest(constraint.spec.field, "cannot constrain a continued final message (assistant "
                             "prefill): the grammar starts at the answer's first token, and this answer "
                             "starts inside the final message; drop one (continue_final_message: false "
                             "starts a new answer)")
    return constraint, ids


async def start_chat(route: Route, chat: ChatInput, limits: Limits, *, id_prefix: str,
                     extra_params: Mapping[str, Any] | None = None) -> ChatRun:
    """Check ``chat``, submit its choices on ``route`` and return them running (a refusal raises
    before anything runs). ``extra_params``: GenerationParams a surface sets beyond the neutral
    request's fields (Ollama's llama.cpp penalty window and Mirostat)."""
    service = CompletionService(route, limits)
    engine = route.engine
    constraint, ids = await _constrained_prompt(route, chat)
    params = attrs.evolve(service.choice_params(chat, ids), **(extra_params or {}),
                          banned_sequences=await service.bad_word_sequences(chat.sampling.bad_words))
    procs = await guided_processors(engine, constraint.spec, chat.n)
    predicted = await prediction_ids(engine, chat.prediction)
    submission = await service.submit(
        [ChoiceRequest(index=i, prompt_ids=ids, params=seeded(params, i), processors=procs[i])
         for i in range(chat.n)],
        id_prefix=id_prefix, prediction=predicted, **submit_options(chat.priority, chat.cache_salt, engine))
    reading = AnswerEvents.of(engine.tokenizer, params.logprobs, prompt_reasoning(route, limits, ids),
                              constraint.tools)
    return ChatRun(submission, reading, ids, predicted=bool(predicted))


#: Prompt tokens read back to see whether the template left a thinking block open: the tag and
#: the newline around it, with room to spare.
_PROMPT_TAIL_TOKENS = 16


def thinks(route: Route, limits: Limits) -> bool:
    """Whether the route's model thinks: its answers are split into thinking and answer (the
    server's ``reasoning_format`` and the model's chat template decide, not the request). The
    surfaces ask it before anything runs, to refuse what only a thinking model can honour."""
    return reasoning_for(limits.reasoning_format, route.engine.info.chat_template, "") is not None


def prompt_reasoning(route: Route, limits: Limits, ids: list[int]) -> Reasoning | None:
    """The split of the outputs of a templated prompt (``ids``) on the route's model: None where the
    model does not think, else whether the prompt left the thinking block open (chat, and
    Ollama's ``/api/generate``)."""
    engine = route.engine
    tail = engine.tokenizer.decode(ids[-_PROMPT_TAIL_TOKENS:], skip_special=False)
    return reasoning_for(limits.reasoning_format, engine.info.chat_template, tail)
