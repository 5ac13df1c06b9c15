"""Ollama's request bodies as pydantic models, and what their fields become in the core's terms.

Every field Ollama's API (and its official Python client) sends to ``/api/chat``,
``/api/generate``, ``/api/show``, ``/api/embed`` and ``/api/embeddings`` is declared here, so
that each is honoured, refused by name unless a value that changes nothing, or accepted for a
stated reason (docs/server.md's Request fields table says which); any other field is a 400
naming it, as on every endpoint of this server. Ollama itself logs and drops an option it does
not know: here a misspelt ``temprature`` must not give a quietly different answer.

``options`` carries Ollama's sampling options, which map onto the sampler every surface shares
(:func:`sampling`), and the options Ollama's runner reads when it loads a model (threads,
GPU layers, batch size, memory mapping): here the server's configuration loads the model, so
those change speed and memory, never the tokens, and are accepted unused. A sampler the core
does not have (Mirostat, tail-free, locally typical sampling; a penalty window) is refused
unless set to its "off" value.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field

from ruvllm.errors import InvalidRequest
from ruvllm.guided.grammar import GrammarSpec, from_extensions
from ruvllm.server.http.strict_fields import RequestBody, StrictModel
from ruvllm.server.lifecycle.model_pool import KeepAlive as PoolKeepAlive
from ruvllm.server.lifecycle.params import penalties_on, penalty_window
from ruvllm.server.lifecycle.request_input import ChatInput, Sampling
from ruvllm.types import MAX_LOGPROBS

_Text = Annotated[str, Field(min_length=1)]
#: Ollama's ``keep_alive``: seconds, or a Go duration ("5m", "1h30m", "0", "-1s").
_Duration = Annotated[str, Field(pattern=r"^[-+]?(0|((\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+)$")]
KeepAlive = float | _Duration | None


class OllamaOptions(StrictModel):
    """``options``: the names Ollama's Modelfile parameters have (docs/server.md lists each)."""

    # Sampling, honoured by the core's sampler (as chat's fields of the same meaning).
    seed: int | None = Field(None, ge=-1)
    num_predict: int | None = Field(None, ge=-2)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    stop: list[_Text] | None = None
    #: The context one request may use, capped at the server's (see ``request_context``).
    num_ctx: int | None = Field(None, ge=1)
    # Samplers the core does not have: refused unless off.
    tfs_z: float | None = None
    typical_p: float | None = None
    mirostat: int | None = None
    repeat_last_n: int | None = None
    penalize_newline: bool | None = None
    #: Read by Mirostat only, which is refused unless off.
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    #: Which tokens survive when Ollama cuts a context that overflows; nothing is cut here.
    num_keep: int | None = None
    # How Ollama's runner loads and runs a model: the server's configuration does that here.
    numa: bool | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    logits_all: bool | None = None
    vocab_only: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    embedding_only: bool | None = None
    num_thread: int | None = None


class OllamaToolCallFunction(StrictModel):
    name: _Text
    #: An object, as Ollama sends it (OpenAI's API sends a JSON string).
    arguments: dict[str, Any] = Field(default_factory=dict)
    #: The call's position in its answer, as Ollama returns it; the list's order is what counts.
    index: int | None = None


class OllamaToolCall(StrictModel):
    function: OllamaToolCallFunction
    id: str | None = None


class OllamaMessage(StrictModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    #: Refused unless empty: ruvllm serves text models.
    images: list[str] | None = None
    #: An earlier answer's thinking: chat templates drop it from earlier turns.
    thinking: str | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class OllamaToolFunction(StrictModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class OllamaTool(StrictModel):
    type: Literal["function"] = "function"
    function: OllamaToolFunction


class _Generation(RequestBody):
    model: _Text
    #: Ollama streams unless told not to (``stream: false``).
    stream: bool | None = None
    #: ``"json"`` (any JSON object) or a JSON schema: the answer is constrained to it.
    format: Literal["", "json"] | dict[str, Any] | None = None
    options: OllamaOptions | None = None
    keep_alive: KeepAlive = None
    #: Whether a thinking model's thinking comes back, in ``thinking``; see ``check_think``.
    think: bool | Literal["high", "medium", "low"] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


class OllamaChatRequest(_Generation):
    #: Empty: load the model and answer ``done_reason: "load"``, as Ollama does.
    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[OllamaTool] | None = None


class OllamaGenerateRequest(_Generation):
    #: Empty: load the model and answer ``done_reason: "load"``, as Ollama does.
    prompt: str = ""
    system: str | None = None
    #: The prompt as is, without the chat template.
    raw: bool = False
    #: The token context an earlier ``/api/generate`` answer returned (deprecated by Ollama).
    context: list[int] | None = None
    #: Refused unless empty: fill-in-the-middle, which ruvllm does not do.
    suffix: str | None = None
    #: Refused unless empty: a Go template for Ollama's renderer; the model's own Jinja one is used.
    template: str | None = None
    images: list[str] | None = None


class OllamaShowRequest(RequestBody):
    model: _Text
    #: Ollama adds the tokenizer's vocabulary arrays; this model_info has no arrays to add.
    verbose: bool | None = None


class OllamaPullRequest(RequestBody):
    model: _Text
    #: Registry options: nothing is downloaded (a served model is here already), so they change nothing.
    insecure: bool | None = None
    stream: bool | None = None


class OllamaEmbedRequest(RequestBody):
    model: _Text
    input: str | list[str]
    #: Ollama cuts an input longer than the context by default; nothing is cut here (a 400).
    truncate: bool | None = None
    #: Refused unless empty (see ``refuse_embedding_options``).
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None
    dimensions: int | None = None


class OllamaEmbeddingsRequest(RequestBody):
    model: _Text
    prompt: str = ""
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None


#: Options ruvllm's sampler cannot honour, with the value that turns each off in Ollama.
_OFF = {"tfs_z": (1.0, "tail-free sampling"), "typical_p": (1.0, "locally typical sampling")}


def llama_cpp_params(options: OllamaOptions | None, core_sampler: bool) -> dict[str, Any]:
    """The GenerationParams of ``options`` that follow llama.cpp's rules, as Ollama's runner
    does: the penalty window (``repeat_last_n``, 64 when left out;
    :func:`ruvllm.server.lifecycle.params.penalty_window`) and Mirostat (``mirostat`` 1 or 2 with its
    ``mirostat_tau`` and ``mirostat_eta``, which replaces the other filters)."""
    o = options or OllamaOptions()
    penalised = penalties_on(o.repeat_penalty, o.presence_penalty, o.frequency_penalty)
    window = penalty_window("options.repeat_last_n", o.repeat_last_n, penalised, core_sampler)
    out: dict[str, Any] = {"penalty_last_n": window}
    if o.mirostat:
        out["mirostat"] = o.mirostat
        out.update({name: value for name, value in (("mirostat_tau", o.mirostat_tau),
                                                    ("mirostat_eta", o.mirostat_eta)) if value is not None})
    return out


def sampling(options: OllamaOptions | None, logprobs: int | None = None) -> Sampling:
    """The neutral request's sampling (``max_tokens``, ``temperature``...) that ``options`` set,
    with ``logprobs`` alternatives per token (None: no logprobs); what the core's sampler cannot
    do is refused naming ``options.<name>``.

    Unset options keep this server's defaults, the same on every surface (temperature 1, no
    top-k, no penalties), not Ollama's Modelfile defaults: the models here have no Modelfile.
    """
    o = options or OllamaOptions()
    for name, (off, what) in _OFF.items():
        value = getattr(o, name)
        if value is not None and value != off:
            raise InvalidRequest(f"options.{name}", f"asks for {what}, which ruvllm's sampler does not "
                                 f"have; leave it out or set it to {off} (off)", value)
    penalised = penalties_on(o.repeat_penalty, o.presence_penalty, o.frequency_penalty)
    if penalised and o.penalize_newline is False:
        raise InvalidRequest("options.penalize_newline", "ruvllm's penalties treat a newline like any "
                             "other token; leave it out or set it to true")
    if o.num_predict == 0:
        raise InvalidRequest("options.num_predict", "must be at least 1, or -1 (until the model stops) "
                             "or -2 (until the context is full), both capped by this server's "
                             "max_tokens_limit; got 0")
    values = {
        # -1 (until the model stops) and -2 (fill the context): what fits, as chat's default.
        "max_tokens": o.num_predict if o.num_predict is not None and o.num_predict > 0 else None,
        # Ollama's -1 is a random seed.
        "seed": o.seed if o.seed != -1 else None,
        "temperature": o.temperature, "top_p": o.top_p, "top_k": o.top_k, "min_p": o.min_p,
        "repetition_penalty": o.repeat_penalty, "presence_penalty": o.presence_penalty,
        "frequency_penalty": o.frequency_penalty, "stop": o.stop,
    }
    return Sampling(logprobs=logprobs, **{k: v for k, v in values.items() if v is not None})


def check_think(think: bool | str | None, thinks: bool) -> None:
    """``think`` against what the model does. The thinking is the model's and its template's to
    decide (docs/server.md, Reasoning models), so on a model that thinks ``think`` says whether
    it comes back (left out or true: in ``thinking``; false: left out, as Anthropic's thinking
    disabled); on one that does not, true has nothing to return. An effort level cannot be set."""
    if isinstance(think, str):
        raise InvalidRequest("think", f"{think!r} sets a reasoning effort, which ruvllm cannot set for a "
                             "model; send true or false, or leave think out")
    if think and not thinks:
        raise InvalidRequest("think", "this model does not think ([server] reasoning_format and its "
                             "chat template), so there is no thinking to return; leave think out or set it "
                             "to false")


def format_grammar(fmt: str | dict[str, Any] | None) -> GrammarSpec | None:
    """The JSON schema ``format`` constrains the answer to (any object for ``"json"``), as the
    grammar of the shared core's ``guided_json`` (which the field table names ``format``)."""
    schema = fmt if isinstance(fmt, dict) else {"type": "object"} if fmt == "json" else None
    return from_extensions(guided_json=schema)


def top_logprobs(body: _Generation) -> int | None:
    """How many alternatives each token's logprob carries, or None without ``logprobs``."""
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidRequest("top_logprobs", "needs logprobs: true")
    return (body.top_logprobs or 0) if body.logprobs else None


def refuse_images(images: list[str] | None, field: str) -> None:
    if images:
        raise InvalidRequest(field, "ruvllm serves text models, which cannot read images; leave images "
                             "out (or empty)")


def refuse_embedding_options(options: dict[str, Any] | None) -> None:
    """For embeddings Ollama reads only the options that size its context and runner (and cuts
    inputs to ``num_ctx``); here the server's configuration sizes them and nothing is cut, so an
    option that is set is refused rather than dropped."""
    given = sorted(k for k, v in (options or {}).items() if v is not None)
    if given:
        raise InvalidRequest(f"options.{given[0]}", "embeddings take no options here (the vector does not "
                             "depend on sampling, and the context is the server's); leave options out")


_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(keep_alive: float | str | None) -> float | PoolKeepAlive | None:
    """Ollama's ``keep_alive`` as the model pool takes it: left out, the model's configured one;
    negative, stay loaded (None); else seconds (a number, or a Go duration such as "1h30m")."""
    if keep_alive is None:
        return PoolKeepAlive.CONFIGURED
    if isinstance(keep_alive, str):
        parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)", keep_alive)
        seconds = sum(float(n) * _SECONDS[unit] for n, unit in parts)
        seconds = -seconds if keep_alive.startswith("-") else seconds
    else:
        seconds = float(keep_alive)
    return None if seconds < 0 else seconds


def chat_request(body: OllamaChatRequest) -> ChatInput:
    """The neutral chat request ``body`` asks for: Ollama's messages as the chat template reads
    them (tool calls' arguments objects, ``tool_name`` as the tool message's ``name``), tools,
    ``format`` and ``options``."""
    messages = []
    for i, m in enumerate(body.messages):
        refuse_images(m.images, f"messages[{i}].images")
        message: dict[str, Any] = {"role": m.role, "content": m.content or ""}
        if m.tool_name:
            message["name"] = m.tool_name
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            message["tool_calls"] = [{"type": "function", **({"id": c.id} if c.id else {}), "function": {
                "name": c.function.name, "arguments": c.function.arguments}} for c in m.tool_calls]
        messages.append(message)
    logprobs = top_logprobs(body)
    return ChatInput(messages=messages, sampling=sampling(body.options, logprobs),
                     tools=[t.model_dump() for t in body.tools] if body.tools else None,
                     grammar=format_grammar(body.format))


def check_generate(body: OllamaGenerateRequest) -> None:
    """Refuse, by name, what ``/api/generate`` cannot honour (before the model is touched)."""
    refuse_images(body.images, "images")
    if body.suffix:
        for field, what in (("raw", body.raw), ("system", body.system), ("context", body.context),
                            ("think", body.think)):
            if what:
                raise InvalidRequest(field, "belongs to a chat prompt; with suffix the prompt is the model's "
                                     "fill-in-the-middle one (the text before and after the gap): leave "
                                     "one out")
    if body.template:
        raise InvalidRequest("template", "is a Go template for Ollama's prompt renderer; ruvllm renders the "
                             "model's own (Jinja) chat template: leave template out, or send the prompt "
                             "formatted by yourself with raw: true")
    if body.raw and body.system:
        raise InvalidRequest("system", "is rendered by the chat template, which raw: true skips; put it "
                             "in the prompt, or leave raw out")
    if body.raw and body.think:
        raise InvalidRequest("think", "raw: true answers as the model writes, without the chat template and "
                             "without splitting thinking from the answer; leave think out, or leave raw out")
    if body.raw and body.context:
        raise InvalidRequest("context", "is the conversation in the chat template's tokens, which raw: "
                             "true skips; send the whole conversation as the prompt, or leave raw out")
