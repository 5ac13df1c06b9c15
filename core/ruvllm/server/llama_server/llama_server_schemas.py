"""llama-server's own request bodies (``/completion``, ``/infill``) and what they mean in core terms.

Scripts written against llama-server and the editor plugins made for it (llama.vim,
llama.vscode) send these. Every field they send is declared here: each is honoured, refused by
name unless a value that changes nothing, or accepted for a stated reason (docs/server.md's
Request fields table says which); any other field is a 400 naming it, as on every endpoint of
this server (llama-server itself ignores a field it does not know).

Sampling runs through the one sampler every surface shares. Unset fields keep this server's
defaults (temperature 1, no top-k, top-p or min-p: the same on every surface), not
llama-server's, as for Ollama's options. ``samplers`` says which samplers run: one left out of
the chain is off, as in llama.cpp; the order is core's (temperature, then top-k, min-p, top-p,
then llama.cpp's ``infill`` sampler where the chain names it).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from ruvllm.errors import InvalidRequest
from ruvllm.guided.grammar import GrammarSpec, from_extensions
from ruvllm.server.http.chat_messages import ChatMessage, ChatTemplateFields
from ruvllm.server.http.strict_fields import RequestBody, StrictModel
from ruvllm.server.lifecycle.request_input import Sampling
from ruvllm.types import MAX_LOGIT_BIAS, MAX_LOGPROBS

_Text = Annotated[str, Field(min_length=1)]
_TokenId = Annotated[int, Field(ge=0)]
#: One prompt: text, token ids, or both mixed (``[12, 34, "text", 56]``).
_Prompt = str | Annotated[list[_TokenId | str], Field(min_length=1)]
#: A bias, or false: the token is never produced.
_Bias = float | bool
#: ``[[token or text, bias], ...]``, or OpenAI's ``{"token or text": bias}``.
_BiasPair = Annotated[list[_TokenId | str | _Bias], Field(min_length=2, max_length=2)]
_LogitBias = list[_BiasPair] | dict[str, _Bias]

#: llama.cpp's sampler names that core's sampler has, and the fields each reads.
_SAMPLER_FIELDS = {"top_k": ("top_k",), "top_p": ("top_p",), "min_p": ("min_p",),
                   "temperature": ("temperature", "dynatemp_range", "dynatemp_exponent"),
                   "penalties": ("repeat_penalty", "presence_penalty", "frequency_penalty"),
                   "typ_p": ("typical_p",), "top_n_sigma": ("top_n_sigma",),
                   "xtc": ("xtc_probability", "xtc_threshold"),
                   "dry": ("dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
                           "dry_sequence_breakers")}
#: llama.cpp's own fill-in-the-middle sampler: named by the editor plugins' chains.
INFILL_SAMPLER = "infill"


class ExtraInput(StrictModel):
    """A chunk of another file, for a model that reads the project around the gap."""

    text: str = ""
    filename: str = "tmp"


class LlamaCompletionRequest(RequestBody):
    """``/completion``'s body."""

    prompt: _Prompt | Annotated[list[_Prompt], Field(min_length=1)]
    model: str | None = None
    # Length and stopping.
    n_predict: int = Field(-1, ge=-1)
    stop: list[_Text] | None = None
    ignore_eos: bool = False
    n_indent: int = Field(0, ge=0)
    t_max_predict_ms: int = Field(0, ge=0)
    # Sampling, through core's sampler.
    temperature: float | None = Field(None, le=2.0)
    top_k: int | None = None
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=-1)
    repeat_penalty: float | None = Field(None, gt=0.0, le=2.0)
    repeat_last_n: int | None = Field(None, ge=-1)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: _LogitBias | None = None
    samplers: list[str] | str | None = None
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    # What comes back.
    n_cmpl: int = Field(1, ge=1)
    stream: bool = False
    n_probs: int = Field(0, ge=0, le=MAX_LOGPROBS)
    return_tokens: bool = False
    response_fields: list[str] | None = None
    # Slots and caching: see docs/server.md.
    cache_prompt: bool = True
    id_slot: int = -1
    t_max_prompt_ms: int | None = None
    n_keep: int = 0
    # llama.cpp's other samplers (ruvllm.llama_samplers), in its order: see llama_sampler_params.
    typical_p: float | None = None
    top_n_sigma: float | None = None
    xtc_probability: float | None = Field(None, ge=0.0, le=1.0)
    xtc_threshold: float | None = Field(None, ge=0.0, le=1.0)
    dynatemp_range: float | None = Field(None, ge=0.0, le=2.0)
    dynatemp_exponent: float | None = Field(None, ge=0.0, le=100.0)
    #: Mirostat 1 or 2 replaces the chain (llama.cpp's rule; llama_sampler_params).
    mirostat: int | None = Field(None, ge=0, le=2)
    mirostat_tau: float | None = Field(None, ge=0.0, le=100.0)
    mirostat_eta: float | None = Field(None, ge=0.0, le=10.0)
    #: DRY (ruvllm.dry), where the chain names ``dry``; 0 off, as llama.cpp's default.
    dry_multiplier: float | None = Field(None, ge=0.0, le=100.0)
    dry_base: float | None = Field(None, ge=1.0, le=100.0)
    dry_allowed_length: int | None = Field(None, ge=1)
    dry_penalty_last_n: int | None = Field(None, ge=-1)
    dry_sequence_breakers: list[str] | None = None
    min_keep: int = 0
    post_sampling_probs: bool = False
    lora: list[dict[str, Any]] | None = None


class LlamaInfillRequest(LlamaCompletionRequest):
    """``/infill``'s body: the text around the gap, the cursor line before the cursor
    (``prompt``) and chunks of other files (``input_extra``)."""

    prompt: str = ""  # type: ignore[assignment]
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[ExtraInput] = []


class ApplyTemplateRequest(RequestBody, ChatTemplateFields):
    """``/apply-template``'s body: a conversation to render, as chat's."""

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None


def _refuse_unsupported(body: LlamaCompletionRequest) -> None:
    for name, off, why in (
            ("min_keep", 0, "core's samplers keep what their thresholds keep"),
            ("post_sampling_probs", False, "n_probs reports the model's own logprobs"),
            ("lora", None, "a request names its adapter through model (docs/server.md, LoRA)")):
        value = getattr(body, name)
        if value not in (off, []):
            raise InvalidRequest(name, f"is not supported by ruvllm ({why}); leave it out", value)


#: llama.cpp's other spellings of the samplers' names.
_ALIASES = {"temp": "temperature", "top-k": "top_k", "top-p": "top_p", "nucleus": "top_p", "min-p": "min_p",
            "typical": "typ_p", "typical_p": "typ_p", "typical-p": "typ_p", "top-n-sigma": "top_n_sigma"}
#: llama.cpp's one-letter names, for a chain sent as a string (``"kpi"``).
_LETTERS = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "m": "min_p", "x": "xtc",
            "t": "temperature", "i": INFILL_SAMPLER, "e": "penalties", "s": "top_n_sigma"}


def _names(samplers: list[str] | str) -> list[str]:
    """The chain's sampler names: a list of names, or a string of llama.cpp's letters."""
    if isinstance(samplers, list):
        return [_ALIASES.get(name, name) for name in samplers]
    unknown = sorted(set(samplers) - set(_LETTERS))
    if unknown:
        raise InvalidRequest("samplers", f"has letters that name no llama.cpp sampler: {''.join(unknown)}; "
                             f"use {''.join(_LETTERS)}", samplers)
    return [_LETTERS[letter] for letter in samplers]


def _chain(samplers: list[str] | str | None) -> set[str]:
    """The samplers that run: all of core's without a chain, else those it names."""
    if samplers is None:
        return set(_SAMPLER_FIELDS)
    named = set(_names(samplers))
    unknown = sorted(named - set(_SAMPLER_FIELDS) - {INFILL_SAMPLER})
    if unknown:
        raise InvalidRequest("samplers", f"names samplers llama.cpp does not have: {', '.join(unknown)}; "
                             f"use {', '.join(sorted(_SAMPLER_FIELDS))}", samplers)
    return named & set(_SAMPLER_FIELDS)


def sampling(body: LlamaCompletionRequest) -> Sampling:
    """The neutral request's sampling (``max_tokens``, ``temperature``...) ``body`` sets; what core
    cannot do is refused naming the field sent. ``n_predict`` 0 evaluates the prompt only."""
    _refuse_unsupported(body)
    running = _chain(body.samplers)
    values: dict[str, Any] = {
        "max_tokens": body.n_predict if body.n_predict > 0 else None,
        # llama.cpp's -1 (and its 32-bit "default seed") is a random seed.
        "seed": body.seed if body.seed is not None and 0 <= body.seed < 0xFFFFFFFF else None,
        "stop": body.stop or None, "ignore_eos": body.ignore_eos,
    }
    if "temperature" in running and body.temperature is not None:
        values["temperature"] = max(body.temperature, 0.0)  # below 0: greedy, as llama.cpp's
    if "top_k" in running and body.top_k is not None:
        values["top_k"] = max(body.top_k, 0)  # 0 or below: off
    if "top_p" in running and body.top_p not in (None, 0.0):
        values["top_p"] = body.top_p
    if "min_p" in running:
        values["min_p"] = body.min_p
    if "penalties" in running:
        values.update(repetition_penalty=body.repeat_penalty, presence_penalty=body.presence_penalty,
                      frequency_penalty=body.frequency_penalty)
    return Sampling(**{k: v for k, v in values.items() if v is not None})


def grammar(body: LlamaCompletionRequest) -> GrammarSpec | None:
    """The answer's constraint, ``json_schema`` or ``grammar`` (the shared core's ``guided_json``
    and ``guided_grammar``, which the field table names as sent)."""
    return from_extensions(guided_json=body.json_schema, guided_grammar=body.grammar)


def llama_sampler_params(body: LlamaCompletionRequest) -> dict[str, Any]:
    """The GenerationParams of llama.cpp's other samplers that ``body`` turns on, where its chain
    runs them (each is off at llama.cpp's off value: typical_p 1, top_n_sigma 0 or below, XTC's
    probability 0, a dynamic-temperature range 0)."""
    running = _chain(body.samplers)
    values: dict[str, Any] = {}
    if body.mirostat:  # whatever the chain: Mirostat replaces it
        values.update(mirostat=body.mirostat, **_sent(body, "mirostat_tau", "mirostat_eta"))
    if "typ_p" in running and body.typical_p is not None and 0 < body.typical_p < 1:
        values["typical_p"] = body.typical_p
    if "top_n_sigma" in running and body.top_n_sigma is not None and body.top_n_sigma > 0:
        values["top_n_sigma"] = body.top_n_sigma
    if "xtc" in running and body.xtc_probability:
        values.update(xtc_probability=body.xtc_probability, **_sent(body, "xtc_threshold"))
    if "dry" in running and body.dry_multiplier:
        values.update(dry_multiplier=body.dry_multiplier, **_sent(
            body, "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers"))
    if "temperature" in running and body.dynatemp_range:
        values.update(dynatemp_range=body.dynatemp_range, **_sent(body, "dynatemp_exponent"))
    return values


def _sent(body: LlamaCompletionRequest, *names: str) -> dict[str, Any]:
    """The fields of ``names`` the request set (the others keep GenerationParams' defaults)."""
    return {name: getattr(body, name) for name in names if getattr(body, name) is not None}


def temperature_last(body: LlamaCompletionRequest) -> bool:
    """Whether the chain runs the temperature after top-p and min-p (llama.cpp's order, and its
    default chain's): they then choose among the model's own probabilities. A chain with the
    temperature between the two is refused: core runs both on one side of it."""
    if body.samplers is None:
        return True
    names = _names(body.samplers)
    if "temperature" not in names:
        return False
    at = names.index("temperature")
    sides = {i < at for i, name in enumerate(names) if name in ("top_p", "min_p")}
    if len(sides) > 1:
        raise InvalidRequest("samplers", "puts the temperature between top_p and min_p; ruvllm's sampler "
                             "runs both before it (llama.cpp's default chain) or both after it",
                             body.samplers)
    return sides == {True}


def samplers_run(body: LlamaCompletionRequest, *, last: bool) -> list[str]:
    """llama-server's ``samplers`` of an answer: the samplers that ran, in the order core ran them
    (``last``: the temperature after the filters)."""
    on = {"typ_p": "typical_p", "top_n_sigma": "top_n_sigma", "xtc": "xtc_probability",
          "dry": "dry_multiplier"}
    active = llama_sampler_params(body)
    if "mirostat" in active:  # it replaces the filters: the penalties, the temperature, then it
        chain = _chain(body.samplers)
        return [*(["penalties"] if "penalties" in chain else []), "temperature",
                "mirostat" if active["mirostat"] == 1 else "mirostat_v2"]
    running = {name for name in _chain(body.samplers) if name not in on or on[name] in active}
    running |= {INFILL_SAMPLER} if infill_sampling(body) else set()
    order = (["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", INFILL_SAMPLER,
              "temperature"] if last else
             ["penalties", "dry", "temperature", "top_k", "min_p", "top_p", INFILL_SAMPLER])
    return [name for name in order if name in running]


def infill_sampling(body: LlamaCompletionRequest) -> bool:
    """Whether the chain names llama.cpp's fill-in-the-middle sampler (ruvllm.infill_sampling)."""
    return body.samplers is not None and INFILL_SAMPLER in _names(body.samplers)


def bias_entries(bias: _LogitBias | None) -> list[tuple[int | str, float]]:
    """``logit_bias`` as ``(token id or text, bias)`` pairs; false is the strongest negative bias
    (the token is never produced)."""
    if not bias:
        return []
    pairs = bias.items() if isinstance(bias, dict) else [tuple(p) for p in bias]
    out: list[tuple[int | str, float]] = []
    for k, (key, value) in enumerate(pairs):
        at = f"logit_bias[{k}]" if isinstance(bias, list) else f"logit_bias.{key}"
        if isinstance(key, bool) or isinstance(value, str) or (isinstance(value, bool) and value):
            raise InvalidRequest(at, "must be [token id or text, bias or false]", [key, value])
        weight = -MAX_LOGIT_BIAS if value is False else float(value)
        if not -MAX_LOGIT_BIAS <= weight <= MAX_LOGIT_BIAS:
            raise InvalidRequest(at, f"a bias must be between {-MAX_LOGIT_BIAS} and {MAX_LOGIT_BIAS}", value)
        if isinstance(key, str) and key.isdigit() and isinstance(bias, dict):
            key = int(key)  # OpenAI's form: token ids as strings
        out.append((key, weight))
    return out
