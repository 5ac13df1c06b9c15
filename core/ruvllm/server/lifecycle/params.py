"""From a surface's neutral request (:mod:`ruvllm.server.lifecycle.request_input`) to what the
engine takes: prompt ids and GenerationParams.

Every refusal is an :class:`ruvllm.errors.InvalidRequest` naming the request's field, which each
surface's field table says in its client's words, so the client sees ``400`` with ``param`` set
rather than a quietly ignored option. Prompts are tokenized
by the engine (``encode_async``: on its model thread, between two steps), never on the event
loop, so a long prompt does not hold up the other requests' streams.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import attrs

from ruvllm.chat import DEFAULT_OPTIONS, TemplateOptions, render_chat
from ruvllm.errors import InvalidRequest
from ruvllm.fim import infill_ids
from ruvllm.guided.tools import ToolPlan, taught_conversation
from ruvllm.server.lifecycle.request_input import RequestInput
from ruvllm.serving import AsyncEngine
from ruvllm.tokenizer import require_encodable
from ruvllm.types import MAX_LOGPROBS, GenerationParams


@attrs.frozen(kw_only=True)
class Limits:
    """Per-request bounds the operator sets (``[server]`` in the config)."""

    max_tokens: int = 4096
    max_n: int = 16
    #: Cap on prompt + max_tokens of one request, below the model's context (None = the model's).
    max_context: int | None = None
    #: Where a chat answer's thinking goes (``[server] reasoning_format``): every API surface
    #: runs its chats with these limits, so the rule travels with them.
    reasoning_format: str = "auto"

    def context_length(self, model_context: int) -> int:
        return min(model_context, self.max_context) if self.max_context else model_context


def chat_prompt_text(engine: AsyncEngine, messages: Sequence[Mapping[str, Any]],
                     tools: ToolPlan | None = None, options: TemplateOptions = DEFAULT_OPTIONS) -> str:
    """``messages`` (as chat templates read them: ChatInput.messages) and the plan's tools in the
    model's own chat template (as ``LLM.chat_prompt``), rendered as the request asks
    (``options``); a template that renders no tools gets them taught in the conversation."""
    st = engine.info.special_tokens
    dicts = [dict(m) for m in messages]
    if tools is not None:
        dicts = taught_conversation(dicts, tools)
    return render_chat(engine.info.chat_template, dicts, bos_token=st.bos_text, eos_token=st.eos_text,
                       tools=tools and tools.rendered, options=options)


async def chat_prompt_ids(engine: AsyncEngine, messages: Sequence[Mapping[str, Any]],
                          tools: ToolPlan | None = None,
                          options: TemplateOptions = DEFAULT_OPTIONS) -> list[int]:
    """Token ids of :func:`chat_prompt_text`: the special tokens the template wrote are parsed."""
    text = chat_prompt_text(engine, messages, tools, options)
    return await engine.encode_async(text, add_special=False, parse_special=True)


async def piece_ids(engine: AsyncEngine, field: str, text: str, *, bos: bool = False,
                    parse_special: bool = False) -> list[int]:
    """Token ids of a piece of text inside a prompt or an answer: the model's BOS before it only
    with ``bos``, special tokens written as text parsed only with ``parse_special``; "" is no
    tokens (the BOS alone with ``bos``), which the engine would refuse as a whole prompt."""
    if not text:
        return engine.tokenizer.encode("", add_special=True) if bos else []
    return await engine.encode_async(require_encodable(field, text), add_special=bos,
                                     parse_special=parse_special)


async def prediction_ids(engine: AsyncEngine, prediction: str | None) -> list[int]:
    """A predicted output's token ids (answer text; none without one)."""
    if not prediction:
        return []
    return await piece_ids(engine, "prediction", prediction)


async def infill_prompts(engine: AsyncEngine, prefixes: Sequence[str], suffix: str) -> list[list[int]]:
    """The fill-in-the-middle prompts asking for what goes between each of ``prefixes`` and
    ``suffix`` (OpenAI's and Ollama's ``suffix``; ruvllm.fim), or a refusal naming ``suffix``
    where the model has no fill-in-the-middle tokens."""
    special = engine.info.special_tokens
    if special.fim is None:
        raise InvalidRequest("suffix", "this model has no fill-in-the-middle tokens, so it cannot write what "
                             "goes between a prompt and a suffix; leave suffix out, or serve a code model "
                             "trained for it (Qwen2.5-Coder, StarCoder2, DeepSeek-Coder; docs/server.md)")
    head = prompt_head(engine)
    before = [await piece_ids(engine, "prompt", p) for p in prefixes]
    after = await piece_ids(engine, "suffix", suffix)
    return [infill_ids(special.fim, head, ids, after) for ids in before]


def prompt_head(engine: AsyncEngine) -> list[int]:
    """What the tokenizer starts every prompt with (the BOS, where the model wants one), for a
    prompt built from pieces: "" costs the event loop nothing to tokenize."""
    return [t for t in engine.tokenizer.encode("", add_special=True)
            if t not in engine.info.special_tokens.eos_ids]


async def completion_prompts(engine: AsyncEngine, prompt: Any, suffix: str | None = None) -> list[list[int]]:
    """Each prompt of a completions request as token ids (a string, ids, or a list of either);
    the strings are tokenized together, in one visit to the engine's model thread. With a
    ``suffix`` each prompt is the text before it, and the model fills in between."""
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif prompt and all(isinstance(t, int) for t in prompt):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    if not prompts:
        raise InvalidRequest("prompt", "must not be empty")
    if suffix:
        if not all(isinstance(p, str) for p in prompts):
            raise InvalidRequest("prompt", "must be text with suffix: the fill-in-the-middle prompt is built "
                                 "from the text before and after the gap")
        return await infill_prompts(engine, prompts, suffix)
    pending = []
    for p in prompts:
        if isinstance(p, str):
            if not p:
                raise InvalidRequest("prompt", "must not be an empty string")
            pending.append(engine.encode_async(require_encodable("prompt", p), add_special=True))
        else:
            pending.append(_ready(list(p)))
    return list(await asyncio.gather(*pending))


async def _ready(ids: list[int]) -> list[int]:
    return ids


def penalties_on(repeat: float | None, presence: float | None, frequency: float | None) -> bool:
    """Whether a request's repetition, presence or frequency penalty is set to do something."""
    return repeat not in (None, 1.0) or bool(presence) or bool(frequency)


def truncated(ids: list[int], keep: int | None, side: str | None, most: int) -> list[int]:
    """vLLM's ``truncate_prompt_tokens``: ``ids`` cut to ``keep`` tokens (-1: ``most``, the
    model's limit) from the left (the last tokens kept, vLLM's default) or the right (the first);
    None: whole, a prompt that does not fit is then refused by name, never cut."""
    if keep is None:
        return ids
    keep = most if keep == -1 else keep
    if len(ids) <= keep:
        return ids
    return ids[:keep] if side == "right" else ids[len(ids) - keep:]


#: llama.cpp's and Ollama's ``repeat_last_n`` when a request leaves it out.
DEFAULT_PENALTY_WINDOW = 64


def penalty_window(field: str, window: int | None, penalised: bool, core_sampler: bool) -> int | None:
    """``GenerationParams.penalty_last_n`` for llama.cpp's or Ollama's ``repeat_last_n``: their
    penalties (over the last ``window`` tokens, 64 when left out, the prompt's included) where
    core's sampler runs. A backend that samples by itself (mistral.rs) penalises the whole
    sequence its own way: there a window is refused where a penalty is on, and -1 accepted."""
    if core_sampler:
        return DEFAULT_PENALTY_WINDOW if window is None else window
    if penalised and window not in (None, -1):
        raise InvalidRequest(field, "this model's backend applies its penalties inside its engine over the "
                             "whole sequence, never a window of the last tokens; leave it out, set -1, or "
                             "serve the model on a backend whose sampling runs in ruvllm "
                             "(capabilities.core_sampler)", window)
    return None


def _refuse(field: str, why: str) -> NoReturn:
    raise InvalidRequest(field, why)


def generation_params(request: RequestInput, *, limits: Limits, room: int,
                      logprobs_supported: bool) -> GenerationParams:
    """GenerationParams for one of ``request``'s choices, checked against the server's ``limits``;
    ``room`` is how many tokens fit after the prompt."""
    s = request.sampling
    if not 1 <= request.n <= limits.max_n:
        _refuse("n", f"must be between 1 and {limits.max_n} on this server; got {request.n}")
    if s.logprobs is not None:
        if not 0 <= s.logprobs <= MAX_LOGPROBS:
            _refuse("logprobs", f"must be between 0 and {MAX_LOGPROBS}; got {s.logprobs}")
        if not logprobs_supported:
            _refuse("logprobs", "this model's backend cannot report logprobs (see `ruvllm backends`)")
    max_tokens = s.max_tokens
    if max_tokens is None:
        max_tokens = max(1, min(limits.max_tokens, room))
    elif max_tokens < 0:
        _refuse("max_tokens", f"must be at least 0; got {max_tokens}")
    elif max_tokens > limits.max_tokens:
        _refuse("max_tokens", f"must be at most {limits.max_tokens} on this server; got {max_tokens}")
    values: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": 1.0 if s.temperature is None else s.temperature,
        "top_p": 1.0 if s.top_p is None else s.top_p,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "stop": s.stop,
        "seed": s.seed,
        "logprobs": s.logprobs,
        "prompt_logprobs": s.prompt_logprobs,
        "ignore_eos": s.ignore_eos,
        "min_tokens": s.min_tokens,
        "skip_special_tokens": s.skip_special_tokens,
        "include_stop_str_in_output": s.include_stop_str_in_output,
        "stop_token_ids": s.stop_token_ids,
        "logit_bias": s.logit_bias,
        "allowed_token_ids": s.allowed_token_ids or (),
        "tenant": request.tenant,  # a learning plugin (SONA) learns per end user
        "batch_invariant": s.batch_invariant,
    }
    for name in ("top_k", "min_p", "repetition_penalty"):
        value = getattr(s, name)
        if value is not None:
            values[name] = value
    return GenerationParams(**values)


def seeded(params: GenerationParams, index: int) -> GenerationParams:
    """Params for choice ``index`` of ``n``: a fixed seed is offset so choices differ but repeat."""
    if params.seed is None or index == 0:
        return params
    return attrs.evolve(params, seed=params.seed + index)
