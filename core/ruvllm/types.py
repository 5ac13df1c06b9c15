"""Value types shared by every backend, the engine, the server and the CLI.

Validation happens in the constructors: an out-of-range value raises
:class:`ruvllm.errors.InvalidRequest` naming the field and the accepted range, so a bad request
is rejected before it reaches an engine and can never corrupt its state.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from ruvllm.errors import InvalidRequest


def _range(low: float | None, high: float | None, *, low_open: bool = False):
    """attrs validator: value within [low, high] (or (low, high] with low_open)."""

    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidRequest(attribute.name, f"must be a number, got {value!r}", value)
        if math.isnan(value):
            # NaN compares false with every bound, so it would slip through the checks below.
            raise InvalidRequest(attribute.name, "must be a number, got NaN", value)
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and value > high
        if too_low or too_high:
            lo = "-inf" if low is None else low
            hi = "inf" if high is None else high
            bracket = "(" if low_open else "["
            raise InvalidRequest(
                attribute.name, f"must be in {bracket}{lo}, {hi}], got {value!r}", value
            )

    return check


def _int_at_least(low: int, high: int | None = None):
    """attrs validator: an integer (not a bool) in [low, high] (high None: unbounded)."""

    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequest(attribute.name, f"must be an integer, got {value!r}", value)
        if high is not None and not low <= value <= high:
            raise InvalidRequest(attribute.name, f"must be an integer in [{low}, {high}], got {value}", value)
        if value < low:
            raise InvalidRequest(attribute.name, f"must be >= {low}, got {value}", value)

    return check


def _as_sequence(field: str, value: Any, what: str) -> tuple[Any, ...]:
    """The items of a list or other iterable; anything else (a number, a dict...) is a typed
    error naming the field rather than a bare TypeError."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise InvalidRequest(field, f"must be {what}, got {value!r}", value)
    return tuple(value)


def _stop_strings(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    out = _as_sequence("stop", value, "a string or a list of strings")
    for s in out:
        if not isinstance(s, str) or not s:
            raise InvalidRequest("stop", f"stop strings must be non-empty strings, got {s!r}", s)
    return out


def _int_tuple(value: Sequence[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    out = _as_sequence("stop_token_ids", value, "a list of token ids")
    for t in out:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise InvalidRequest("stop_token_ids", f"must be token ids >= 0, got {t!r}", t)
    return out


MAX_LOGPROBS = 20

#: Temperatures below this decode greedily.
GREEDY_TEMPERATURE = 1e-5

#: OpenAI's bound on one ``logit_bias`` value.
MAX_LOGIT_BIAS = 100.0


def _sequences(value: Iterable[Iterable[int]]) -> tuple[tuple[int, ...], ...]:
    out = tuple(tuple(int(t) for t in seq) for seq in value)
    if any(not seq for seq in out):
        raise InvalidRequest("banned_sequences", "each sequence needs at least one token")
    return out


def _logit_bias(value: Mapping[Any, Any] | Iterable[tuple[Any, Any]] | None) -> tuple[tuple[int, float], ...]:
    """``{token id: bias}`` (OpenAI sends the ids as strings) as sorted ``(id, bias)`` pairs,
    so the frozen params stay hashable; a bias outside [-100, 100] or a bad id is refused."""
    if not value:
        return ()
    items = value.items() if isinstance(value, Mapping) else value
    out: dict[int, float] = {}
    for key, bias in items:
        try:
            tid = int(key)
        except (TypeError, ValueError):
            raise InvalidRequest("logit_bias", f"keys must be token ids, got {key!r}", key) from None
        if tid < 0:
            raise InvalidRequest("logit_bias", f"token ids must be >= 0, got {tid}", tid)
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or math.isnan(bias) \
                or not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise InvalidRequest("logit_bias", f"bias of token {tid} must be a number in "
                                 f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], got {bias!r}", bias)
        out[tid] = float(bias)
    return tuple(sorted(out.items()))


def _min_tokens(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    _int_at_least(0)(instance, attribute, value)
    if value > instance.max_tokens:
        raise InvalidRequest("min_tokens", f"must be at most max_tokens ({instance.max_tokens}); got {value}",
                             value)


def _adapter_name(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise InvalidRequest("adapter", f"must be a non-empty adapter name (or null for the base model), "
                             f"got {value!r}", value)


def _tenant(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise InvalidRequest("user", f"must be a string naming the end user, got {value!r}", value)


@attrs.frozen(kw_only=True)
class GenerationParams:
    """What to generate: length, sampling, stopping and logprobs.

    ``temperature == 0`` means greedy decoding. ``seed`` makes sampling reproducible: the same
    seed, prompt and parameters give the same tokens on the same backend.
    """

    #: 0 generates nothing: the request scores its prompt (``prompt_logprobs``) or only echoes it.
    max_tokens: int = attrs.field(default=256, validator=_int_at_least(0))
    #: vLLM's: this many tokens at least before the request may end: the tokens that would end it
    #: (EOS unless ``ignore_eos``, ``stop_token_ids``) are not sampled and stop strings are not
    #: matched until then. Needs core's sampler; a grammar that is complete still ends the answer.
    min_tokens: int = attrs.field(default=0, validator=_min_tokens)
    temperature: float = attrs.field(default=0.0, validator=_range(0.0, 2.0))
    top_p: float = attrs.field(default=1.0, validator=_range(0.0, 1.0, low_open=True))
    top_k: int = attrs.field(default=0, validator=_int_at_least(0))
    min_p: float = attrs.field(default=0.0, validator=_range(0.0, 1.0))
    repetition_penalty: float = attrs.field(default=1.0, validator=_range(0.0, 2.0, low_open=True))
    frequency_penalty: float = attrs.field(default=0.0, validator=_range(-2.0, 2.0))
    presence_penalty: float = attrs.field(default=0.0, validator=_range(-2.0, 2.0))
    #: llama.cpp's penalties (its and Ollama's ``repeat_last_n``): all three count the last this
    #: many tokens of the prompt and the output (-1: all of them; 0: the penalties are off). None:
    #: OpenAI's and vLLM's, ``repetition_penalty`` over every prompt and output token seen and the
    #: frequency and presence penalties over the output's counts. Needs core's sampler.
    penalty_last_n: int | None = attrs.field(default=None, validator=_int_at_least(-1))
    stop: tuple[str, ...] = attrs.field(default=(), converter=_stop_strings)
    stop_token_ids: tuple[int, ...] = attrs.field(default=(), converter=_int_tuple)
    ignore_eos: bool = False
    #: The answer's text hides special (control) tokens, as ``decode(skip_special_tokens=True)``;
    #: false shows them (vLLM's ``skip_special_tokens``). The ending EOS is never text.
    skip_special_tokens: bool = True
    #: The stop string or stop token that ended the answer is part of its text (vLLM's
    #: ``include_stop_str_in_output``); a special stop token shows only with skip_special_tokens false.
    include_stop_str_in_output: bool = False
    seed: int | None = attrs.field(default=None, validator=_int_at_least(0))
    #: Number of top alternatives to report per token (0 = only the chosen token's logprob,
    #: None = no logprobs at all).
    logprobs: int | None = attrs.field(default=None, validator=_int_at_least(0, MAX_LOGPROBS))
    #: Name of a loaded LoRA adapter to generate with (backends with ``Capabilities.lora``);
    #: None runs the base model (or whatever adapter a SONA router picks).
    adapter: str | None = attrs.field(default=None, validator=_adapter_name)
    #: Whom the request is for (the server's ``user``): learning plugins learn per tenant, so one
    #: tenant's feedback never changes another's outputs. None: no tenant (the shared one).
    tenant: str | None = attrs.field(default=None, validator=_tenant)
    #: This request's tokens and logprobs the same bits whatever runs beside it (docs/engine.md,
    #: "Batch-invariant mode"): so for every request of an engine built with ``batch_invariant``;
    #: on another engine its rows run through the executor's invariant kernels where it has them
    #: (``BatchExecutor.invariant_rows``), and the engine refuses it where it has none.
    batch_invariant: bool = False
    #: ``(token id, bias)`` pairs added to the logits before the sampler chooses (OpenAI's
    #: ``logit_bias``; a dict is accepted). Reported logprobs stay the model's own.
    logit_bias: tuple[tuple[int, float], ...] = attrs.field(default=(), converter=_logit_bias)
    #: vLLM's ``allowed_token_ids``: only these tokens may be chosen (the end tokens too: left
    #: out, the answer runs to ``max_tokens``). Empty: any. Needs core's sampler.
    allowed_token_ids: tuple[int, ...] = attrs.field(default=(), converter=_int_tuple)
    #: vLLM's ``bad_words``, as the token sequences they are written as: a sequence's last token
    #: is never chosen right after the rest of it (a one-token sequence, never). Needs core's sampler.
    banned_sequences: tuple[tuple[int, ...], ...] = attrs.field(default=(), converter=_sequences)
    #: llama.cpp's fill-in-the-middle sampler after top-k, min-p and top-p (ruvllm.infill_sampling;
    #: llama-server's ``infill`` in ``samplers``). Needs core's sampler.
    infill_sampling: bool = False
    #: llama.cpp's chain order: top-k, top-p, then min-p choose among the model's own probabilities
    #: (temperature 1), and the temperature then reshapes what they kept. The default is vLLM's and
    #: transformers' order: the temperature first, then top-k, min-p and top-p over the result.
    #: Needs core's sampler.
    temperature_last: bool = False
    #: llama.cpp's other samplers (ruvllm.llama_samplers), in its order only (``temperature_last``):
    #: locally typical sampling (1: off), top-n-sigma (0: off), XTC (probability 0: off; a
    #: threshold above 0.5 never drops anything) and the dynamic temperature (a spread of 0: off).
    #: Need core's sampler.
    typical_p: float = attrs.field(default=1.0, validator=_range(0.0, 1.0, low_open=True))
    top_n_sigma: float = attrs.field(default=0.0, validator=_range(0.0, 100.0))
    xtc_probability: float = attrs.field(default=0.0, validator=_range(0.0, 1.0))
    xtc_threshold: float = attrs.field(default=0.1, validator=_range(0.0, 1.0))
    dynatemp_range: float = attrs.field(default=0.0, validator=_range(0.0, 2.0))
    dynatemp_exponent: float = attrs.field(default=1.0, validator=_range(0.0, 100.0))
    #: llama.cpp's DRY (ruvllm.dry): a token that would extend a sequence seen earlier in the last
    #: ``dry_penalty_last_n`` tokens (-1: all) loses ``multiplier * base ** (length -
    #: allowed_length)``; the breakers end what a repetition may span. 0: off. Needs core's sampler
    #: and the model's tokenizer (request_sampler).
    dry_multiplier: float = attrs.field(default=0.0, validator=_range(0.0, 100.0))
    dry_base: float = attrs.field(default=1.75, validator=_range(1.0, 100.0))
    dry_allowed_length: int = attrs.field(default=2, validator=_int_at_least(1))
    dry_penalty_last_n: int = attrs.field(default=-1, validator=_int_at_least(-1))
    dry_sequence_breakers: tuple[str, ...] = attrs.field(default=("\n", ":", "\"", "*"), converter=tuple)
    #: llama.cpp's (and Ollama's) Mirostat: 1 or 2 replaces top-k, top-p, min-p and the other
    #: filters with a surprise-bounded draw at the temperature (0: off). Needs core's sampler.
    mirostat: int = attrs.field(default=0, validator=_int_at_least(0, 2))
    mirostat_tau: float = attrs.field(default=5.0, validator=_range(0.0, 100.0))
    mirostat_eta: float = attrs.field(default=0.1, validator=_range(0.0, 10.0))
    #: Logprobs of the prompt's own tokens, from the prefill logits, with this many top
    #: alternatives each (None = not computed). The first prompt token has none (nothing
    #: precedes it). Needs the executor path; such a request never reuses cached prefix KV.
    prompt_logprobs: int | None = attrs.field(default=None, validator=_int_at_least(0, MAX_LOGPROBS))

    @property
    def greedy(self) -> bool:
        # Below 1e-5 (vLLM's threshold) sampling IS greedy in effect, and dividing float32
        # logits by such a temperature overflows to inf/NaN (a 1e-40 temperature is 0 in float32).
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def llama_cpp_samplers(self) -> tuple[str, ...]:
        """The fields of llama.cpp's other samplers this request turns on."""
        on = {"typical_p": self.typical_p < 1.0, "top_n_sigma": self.top_n_sigma > 0,
              "xtc_probability": self.xtc_probability > 0, "dynatemp_range": self.dynatemp_range > 0,
              "mirostat": self.mirostat > 0, "dry_multiplier": self.dry_multiplier > 0}
        return tuple(name for name, set_ in on.items() if set_)

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )


class FinishReason(str, enum.Enum):
    """Why a generation ended; the values are the OpenAI ``finish_reason`` strings."""

    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens reached (or the context filled)
    CANCELLED = "cancelled"
    ERROR = "error"


@attrs.frozen
class TokenLogprob:
    token_id: int
    text: str
    logprob: float


@attrs.frozen(kw_only=True)
class PromptLogprob:
    """One prompt token's logprob under the model, given the tokens before it."""

    token_id: int
    text: str
    logprob: float
    top_logprobs: tuple[TokenLogprob, ...] = ()
    #: Its place in the model's distribution: 1 + the number of tokens more probable.
    rank: int = 1


@attrs.frozen(kw_only=True)
class SampledToken:
    """One token as chosen by a backend, before core turns it into text."""

    token_id: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@attrs.frozen(kw_only=True)
class TokenOutput:
    """One streamed step: the token and the text it completes.

    ``text`` is the newly *decodable* text, which may be empty while a multi-byte character is
    still incomplete, or while a possible stop string is held back.
    """

    index: int
    #: None only for a final text-only flush (held-back text released at the end).
    token_id: int | None
    text: str
    logprob: float | None = None
    top_logprobs: tuple[TokenLogprob, ...] = ()


@attrs.frozen(kw_only=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    #: Speculative decoding: tokens drafted for this request and, of those, accepted (part of
    #: ``completion_tokens``); 0 without speculation.
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    #: Prompt tokens whose KV came from the prefix cache rather than being computed for this
    #: request (part of ``prompt_tokens``; OpenAI's ``cached_tokens``); 0 on a backend without one.
    cached_prompt_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@attrs.frozen(kw_only=True)
class Timings:
    """Wall-clock phases of one request, in seconds."""

    queue: float = 0.0
    prefill: float = 0.0
    decode: float = 0.0
    time_to_first_token: float = 0.0

    @property
    def total(self) -> float:
        return self.queue + self.prefill + self.decode


@attrs.frozen(kw_only=True)
class GenerationResult:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    logprobs: tuple[TokenLogprob, ...] | None = None
    #: Which stop string or token ended the request, when one did.
    stop_reason: str | int | None = None
    #: With ``params.prompt_logprobs``: one entry per prompt token, None for the first.
    prompt_logprobs: tuple[PromptLogprob | None, ...] | None = None

    @property
    def decode_tokens_per_second(self) -> float:
        """Tokens after the first, per second of decode time."""
        n = self.usage.completion_tokens - 1
        return n / self.timings.decode if n > 0 and self.timings.decode > 0 else 0.0


@attrs.frozen
class FimTokens:
    """A code model's fill-in-the-middle tokens (ruvllm.fim): the prompt is prefix-suffix-middle."""

    prefix: int
    suffix: int
    middle: int
    #: The repository-name and file-separator tokens of models trained on whole repositories
    #: (Qwen2.5-Coder, StarCoder2): other files of the project go before the prefix, each under
    #: its name. None where the model has not both.
    repo: int | None = None
    file_sep: int | None = None


@attrs.frozen(kw_only=True)
class SpecialTokens:
    bos_id: int | None
    eos_ids: tuple[int, ...]
    pad_id: int | None = None
    bos_text: str = ""
    eos_text: str = ""
    #: Fill-in-the-middle tokens; None: the model cannot fill in (a ``suffix`` is refused).
    fim: FimTokens | None = None


@attrs.frozen(kw_only=True)
class ModelInfo:
    name: str
    architecture: str
    context_length: int
    vocab_size: int
    special_tokens: SpecialTokens
    chat_template: str | None = None
    path: str | None = None
    quantization: str | None = None
    parameters: int | None = None
    #: The most tokens one embeddings input may have, where the model is served with embeddings
    #: (the ServingEngine fills it in from ``LlmBackend.max_embedding_tokens``); None: no embeddings.
    embedding_tokens: int | None = None


@attrs.frozen(kw_only=True)
class Capabilities:
    """What a backend can do; tests and features gate on these, never on backend names."""

    streaming: bool = True
    #: The backend implements :class:`ruvllm.executor.BatchExecutor` (iteration-level).
    executor: bool = False
    #: Logprobs of sampled tokens and top alternatives.
    logprobs: bool = False
    #: Sampling happens in ruvllm's shared sampler (else inside the engine underneath).
    core_sampler: bool = True
    #: Requests may run concurrently through the request-level path.
    concurrent_requests: bool = False
    lora: bool = False
    isq: bool = False
    paged_attention: bool = False
    embeddings: bool = False
    #: A sequence's logits do not depend on what else shares its forward pass (bit for bit), so
    #: batched and solo greedy output must be identical. Most CPU and GPU kernels pick other
    #: blocking or reduction orders by batch size and flip near-ties: those backends leave this
    #: False and the conformance suite checks isolation with its near-tie rule instead.
    batch_invariant: bool = False
    #: The executor can be made batch-invariant on request (``[engine] batch_invariant``,
    #: ``create_executor(..., batch_invariant=True)``); an engine built so reports
    #: ``batch_invariant`` in its own capabilities.
    batch_invariant_mode: bool = False
    device: str = "cpu"
    #: Why a capability is absent where a user might expect it.
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class Trajectory:
    """One finished request as the SONA learning loops see it."""

    request_id: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    #: Mean-pooled hidden state of the prompt, when the backend can produce one.
    embedding: Any = None
    #: User feedback in [-1, 1]; None until feedback arrives.
    feedback: float | None = None
    adapter: str | None = None
    #: The request's ``GenerationParams.tenant``.
    tenant: str | None = None
