"""What a surface asks of the lifecycle: one request, in no API's words.

Every surface parses its own body (OpenAI's, Anthropic's, Ollama's, llama-server's, the Responses
API's) and translates it into a :class:`ChatInput` (a conversation) or a :class:`RequestInput`
(prompts the surface has already made token ids of), which
:func:`~ruvllm.server.lifecycle.chat_run.start_chat` and
:func:`~ruvllm.server.lifecycle.completion_run.start_completion` take. Nothing here is a wire
schema: the values are what the engine needs, checked by the surface's own schema for their
types and ranges and by the lifecycle against the server's limits and the model.

The names are the ones the lifecycle's refusals use (``max_tokens``, ``logprobs``, ``tools[1]``,
``prompt``, ``messages[3]``); each surface's field table (:mod:`ruvllm.server.http.field_names`)
says them in its client's words. The adapter is not a field: the model name a client sends picks
the route, and the route carries its adapter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ruvllm.chat import DEFAULT_OPTIONS, TemplateOptions
from ruvllm.guided.grammar import GrammarSpec


@attrs.frozen(kw_only=True)
class Sampling:
    """How each choice's tokens are chosen, and when it ends: what becomes its
    :class:`~ruvllm.types.GenerationParams` (None: the server's default, the same on every surface)."""

    #: None: what fits after the prompt, within the server's ``max_tokens``. 0 only where the
    #: surface allows scoring the prompt alone (OpenAI's ``echo``).
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: str | Sequence[str] | None = None
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stop_token_ids: Sequence[int] | None = None
    #: Token id (as a string) -> bias added to its logit.
    logit_bias: Mapping[str, float] | None = None
    allowed_token_ids: Sequence[int] | None = None
    #: Words never written (vLLM's rule: at the start of the answer or after a space).
    bad_words: Sequence[str] | None = None
    #: Each token's logprob with this many alternatives; None: no logprobs.
    logprobs: int | None = None
    #: Each prompt position's logprobs with this many alternatives; None: none.
    prompt_logprobs: int | None = None
    #: The same tokens and logprobs whatever runs beside the request.
    batch_invariant: bool = False


@attrs.frozen(kw_only=True)
class RequestInput:
    """What every request asks, chat or text completion: ``start_completion`` takes it with the
    prompts' token ids, which each surface builds its own way (text, ids, fill-in-the-middle)."""

    #: Choices per prompt.
    n: int = 1
    sampling: Sampling = attrs.field(factory=Sampling)
    #: The output constraint, already naming the field the client set (a JSON schema, regex,
    #: choice or grammar); the tools' own grammar, if any, is the lifecycle's to add.
    grammar: GrammarSpec | None = None
    #: Whom the request is for: a learning plugin (SONA) learns each tenant's feedback apart.
    tenant: str | None = None
    #: vLLM's meaning: LOWER runs first (needs the engine's priority policy).
    priority: int = 0
    #: Requests share cached KV only with the same salt.
    cache_salt: str | None = None


@attrs.frozen(kw_only=True)
class ChatInput(RequestInput):
    """A conversation to answer: ``start_chat`` renders it in the model's chat template."""

    #: The conversation as chat templates read it (:func:`ruvllm.chat.render_chat`): ``role``,
    #: ``content`` text, and where set ``name``, ``tool_calls`` (``{"id", "type": "function",
    #: "function": {"name", "arguments"}}``, arguments an object) and ``tool_call_id``.
    messages: Sequence[Mapping[str, Any]]
    #: Function tools as ``{"type": "function", "function": {"name", "description",
    #: "parameters"}}`` dicts (ruvllm.guided.tools reads them), or None.
    tools: Sequence[Mapping[str, Any]] | None = None
    #: ``auto``, ``none``, ``required`` or ``{"type": "function", "function": {"name": ...}}``;
    #: None: ``auto`` with tools.
    tool_choice: Any = None
    #: Whether one answer may hold several calls; None: ruvllm's default for the model.
    parallel_tool_calls: bool | None = None
    #: How the messages become a prompt (generation prompt, a continued final message, template variables).
    template: TemplateOptions = DEFAULT_OPTIONS
    #: The answer the client expects, as text: its matching tokens are verified as drafts.
    prediction: str | None = None
    #: Keep this many of the prompt's tokens (-1: the model's context), cut from ``truncation_side``;
    #: None: a prompt that does not fit is refused, never cut.
    truncate_prompt_tokens: int | None = None
    truncation_side: str | None = None

