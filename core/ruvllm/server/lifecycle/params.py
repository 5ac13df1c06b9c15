"""From an OpenAI request body to what the engine takes: prompt ids and GenerationParams.

Every refusal is an :class:`ruvllm.errors.InvalidRequest` naming the OpenAI field, so the
client sees ``400`` with ``param`` set rather than a quietly ignored option. Prompts are tokenized
by the engine (``encode_async``: on its model thread, between two steps), never on the event
loop, so a long prompt does not hold up the other requests' streams.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any, NoReturn

import attrs

from ruvllm.chat import DEFAULT_OPTIONS, TemplateOptions, render_chat
from ruvllm.errors import InvalidRequest
from ruvllm.fim import infill_ids
from ruvllm.guided.tools import ToolPlan, taught_conversation
from ruvllm.server.lifecycle.schemas import (
    MAX_COMPLETION_LOGPROBS,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    Prediction,
)
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


def message_dicts(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Plain dicts for the chat template: text content parts joined, an assistant's ``refusal``
    as its content, ``tool_calls`` with their arguments as objects, a ``developer`` turn (what
    OpenAI's newer clients send for instructions) as the system turn chat templates know, for chat
    and the Responses API alike. The deprecated functions API's turns are the tool turns they
    stand for: an assistant's ``function_call`` its one tool call, a ``function`` message that
    call's answer. What cannot be rendered (image or audio parts, a reference to an audio answer)
    is a 400 naming it, never dropped."""
    out = []
    legacy_call: str | None = None
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if m.audio is not None:
            _refuse(f"{at}.audio", _AUDIO_REFERENCE)
        content = _content_text(m.content, at)
        if m.refusal:
            if m.role != "assistant":
                _refuse(f"{at}.refusal", f"belongs to an assistant message; this one's role is {m.role!r}")
            if content:
                _refuse(f"{at}.refusal", "give the assistant's turn as content or as refusal, not both")
            content = m.refusal
        role = {"developer": "system", "function": "tool"}.get(m.role, m.role)
        d: dict[str, Any] = {"role": role, "content": content}
        if m.name:
            d["name"] = m.name
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.tool_calls is not None:
            d["tool_calls"] = _template_tool_calls(m.tool_calls, f"{at}.tool_calls")
        if m.function_call is not None:
            if m.role != "assistant" or m.tool_calls is not None:
                _refuse(f"{at}.function_call", "is an assistant's call of the deprecated functions API; "
                        "give it on an assistant message without tool_calls")
            legacy_call = f"call_{i}"
            d["tool_calls"] = _template_tool_calls([{"id": legacy_call, "type": "function",
                                                     "function": m.function_call}], f"{at}.function_call")
        if m.role == "function":
            if not m.name or legacy_call is None:
                _refuse(f"{at}.name" if not m.name else f"{at}.role",
                        "a function message answers the assistant's function_call before it, by the "
                        "function's name")
            d["tool_call_id"] = legacy_call
        out.append(d)
    return out


_AUDIO_REFERENCE = ("refers to an earlier audio answer, and ruvllm serves text models; send that answer's "
                    "transcript as content (or audio: null)")
#: The keys of a text content part (the ``openai`` client's ChatCompletionContentPartTextParam).
_TEXT_PART_KEYS = frozenset({"type", "text"})


def _content_text(content: str | list[dict[str, Any]] | None, at: str) -> str:
    """A message's content as one string: text parts joined; any other part, or a key a text part
    does not have, is a 400 naming it."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            _refuse(f"{at}.content[{j}]", f"only text parts are supported; got type {part.get('type')!r}")
        unknown = sorted(set(part) - _TEXT_PART_KEYS)
        if unknown:
            _refuse(f"{at}.content[{j}].{unknown[0]}", f"unknown field{'s' if len(unknown) > 1 else ''} "
                    f"{', '.join(unknown)} of a text part (it has type and text); remove "
                    f"{'them' if len(unknown) > 1 else 'it'}")
        texts.append(part["text"])
    return "".join(texts)


def _template_tool_calls(calls: Any, field: str) -> list[Any]:
    """An assistant turn's ``tool_calls`` as chat templates read them: ``arguments`` as an object.

    OpenAI clients send the arguments as a JSON string; tool-use templates (transformers'
    convention, which vLLM follows) render ``arguments | tojson``, so a string would reach the
    model quoted twice.
    """
    if not isinstance(calls, list):
        raise InvalidRequest(field, f"must be a list of tool calls, got {type(calls).__name__}")
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequest(f"{field}[{j}]", 'must be {"type": "function", "function": '
                                 '{"name": ..., "arguments": ...}} as the API returned it')
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except json.JSONDecodeError as exc:
                raise InvalidRequest(f"{field}[{j}].function.arguments",
                                     f"is not valid JSON ({exc.msg} at character {exc.pos}); send the "
                                     "arguments string the API returned for this call") from None
        out.append({**call, "function": {**function, "arguments": arguments}})
    return out


def chat_prompt_text(engine: AsyncEngine, messages: Sequence[ChatMessage], tools: ToolPlan | None = None,
                     options: TemplateOptions = DEFAULT_OPTIONS) -> str:
    """``messages`` (and the plan's tools) in the model's own chat template (as
    ``LLM.chat_prompt``), rendered as the request asks (``options``); a template that renders no
    tools gets them taught in the conversation."""
    st = engine.info.special_tokens
    dicts = message_dicts(messages)
    if tools is not None:
        dicts = taught_conversation(dicts, tools)
    return render_chat(engine.info.chat_template, dicts, bos_token=st.bos_text, eos_token=st.eos_text,
                       tools=tools and tools.rendered, options=options)


async def chat_prompt_ids(engine: AsyncEngine, messages: Sequence[ChatMessage],
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


async def prediction_ids(engine: AsyncEngine, prediction: Prediction | None) -> list[int]:
    """OpenAI's predicted output as token ids (answer text)."""
    if prediction is None:
        return []
    return await piece_ids(engine, "prediction", _content_text(prediction.content, "prediction"))


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


def _check_common(req: ChatCompletionRequest | CompletionRequest, limits: Limits) -> None:
    if not 1 <= req.n <= limits.max_n:
        _refuse("n", f"must be between 1 and {limits.max_n} on this server; got {req.n}")
    if req.best_of not in (None, 1):
        _refuse("best_of", "is not supported by ruvllm; use n for several completions")
    if req.stream_options is not None and not req.stream:
        _refuse("stream_options", "is only allowed when stream is true")
    if req.stream_options is not None and req.stream_options.include_obfuscation:
        _refuse("stream_options.include_obfuscation", "ruvllm does not pad stream chunks with OpenAI's "
                "random obfuscation field; leave it out (or false), and serve over TLS or loopback")


def generation_params(req: ChatCompletionRequest | CompletionRequest, *, limits: Limits,
                      room: int, logprobs_supported: bool) -> GenerationParams:
    """GenerationParams for one choice; ``room`` is how many tokens fit after the prompt."""
    _check_common(req, limits)
    lp_field = "logprobs"
    fewest = 1
    if isinstance(req, ChatCompletionRequest):
        max_field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        logprobs: int | None = None
        if req.top_logprobs is not None and not req.logprobs:
            _refuse("top_logprobs", "needs logprobs: true")
        if req.logprobs:
            logprobs = req.top_logprobs or 0
            if not 0 <= logprobs <= MAX_LOGPROBS:
                _refuse("top_logprobs", f"must be between 0 and {MAX_LOGPROBS}; got {logprobs}")
            lp_field = "top_logprobs" if req.top_logprobs else "logprobs"
    else:
        if req.suffix and req.echo:
            _refuse("echo", "cannot be used with suffix: a fill-in-the-middle prompt is not the text sent "
                    "(OpenAI refuses the pair too); leave one out")
        max_field, max_tokens = "max_tokens", req.max_tokens
        logprobs = req.logprobs
        if logprobs is not None and not 0 <= logprobs <= MAX_COMPLETION_LOGPROBS:
            _refuse("logprobs", f"must be between 0 and {MAX_COMPLETION_LOGPROBS}; got {logprobs}")
        if max_tokens == 0 and not req.echo:
            _refuse("max_tokens", "may be 0 only with echo: true (to score the prompt); got 0")
        if req.echo:
            fewest = 0  # the prompt alone, scored (with logprobs); nothing is generated
    if logprobs is not None and not logprobs_supported:
        _refuse(lp_field, "this model's backend cannot report logprobs (see `ruvllm backends`)")
    if max_tokens is None:
        max_tokens = max(1, min(limits.max_tokens, room))
    elif max_tokens < fewest:
        _refuse(max_field, f"must be at least {fewest}; got {max_tokens}")
    elif max_tokens > limits.max_tokens:
        _refuse(max_field, f"must be at most {limits.max_tokens} on this server; got {max_tokens}")
    values: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "stop": req.stop,
        "seed": req.seed,
        "logprobs": logprobs,
        "ignore_eos": req.ignore_eos,
        "min_tokens": req.min_tokens,
        "skip_special_tokens": req.skip_special_tokens,
        "include_stop_str_in_output": req.include_stop_str_in_output,
        "stop_token_ids": req.stop_token_ids,
        "logit_bias": req.logit_bias,
        "allowed_token_ids": req.allowed_token_ids or (),
        "tenant": req.user,  # a learning plugin (SONA) learns per end user
        "batch_invariant": req.batch_invariant,
    }
    if isinstance(req, CompletionRequest) and req.echo and logprobs is not None:
        values["prompt_logprobs"] = logprobs  # OpenAI's echo + logprobs: the prompt's logprobs too
    if req.prompt_logprobs is not None:
        if req.stream:
            _refuse("prompt_logprobs", "cannot be streamed: the prompt's logprobs reach the server with the "
                    "end of the answer; ask without stream (or use echo with logprobs on /v1/completions, "
                    "whose stream sends them first)")
        values["prompt_logprobs"] = max(req.prompt_logprobs, values.get("prompt_logprobs") or 0)
    for name in ("top_k", "min_p", "repetition_penalty"):
        value = getattr(req, name)
        if value is not None:
            values[name] = value
    return GenerationParams(**values)


def seeded(params: GenerationParams, index: int) -> GenerationParams:
    """Params for choice ``index`` of ``n``: a fixed seed is offset so choices differ but repeat."""
    if params.seed is None or index == 0:
        return params
    return attrs.evolve(params, seed=params.seed + index)
