"""ruvllm's GenerationParams -> a mistral.rs ``ChatCompletionRequest``.

mistral.rs samples inside its engine, so sampling parameters are passed through. Stopping is
core's job: no stop strings are sent, so every token reaches core, which ends the request (EOS,
stop ids, stop strings, max_tokens) and closes the stream. One exception: mistral.rs streams no
chunk for a special token, EOS included. So it stops at EOS itself (the backend then hands core
the EOS id, and continues after it under ``ignore_eos``), and special tokens other than EOS
are banned from sampling, since core could not see them. ``logprobs`` is always on because each token's
bytes and log-probability are how the plugin recovers its id (:mod:`ruvllm_mistralrs.token_ids`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ruvllm.errors import InvalidRequest
from ruvllm.types import GenerationParams

SEED_UNSUPPORTED = (
    "mistral.rs samples inside its engine with one random generator seeded when the model loads "
    "(backend option seed=N); it cannot seed a single request. Drop seed, use temperature=0, or "
    "use a backend whose sampling runs in ruvllm (capabilities.core_sampler)"
)


def chat_request(m: Any, prompt_text: str, params: GenerationParams, *, adapter: str | None,
                 banned: Sequence[int] = ()) -> Any:
    """``banned`` token ids get a -inf logit bias: mistral.rs sends no stream chunk for a special
    token, so a special token core could not see must not be sampled at all."""
    if params.seed is not None and not params.greedy:
        raise InvalidRequest("seed", SEED_UNSUPPORTED, params.seed)
    if params.min_tokens:
        raise InvalidRequest("min_tokens", "mistral.rs samples inside its engine and has no minimum length, "
                             "so the end of the answer cannot be kept out; drop min_tokens or use a backend "
                             "whose sampling runs in ruvllm (capabilities.core_sampler)", params.min_tokens)
    if params.infill_sampling:
        raise InvalidRequest("infill_sampling", "mistral.rs samples inside its engine, which has no "
                             "fill-in-the-middle sampler; drop it or use a backend whose sampling runs in "
                             "ruvllm (capabilities.core_sampler)", True)
    if params.temperature_last and not params.greedy:
        raise InvalidRequest("temperature_last", "mistral.rs samples inside its engine in its own order (the "
                             "temperature first); drop llama.cpp's order or use a backend whose sampling "
                             "runs in ruvllm (capabilities.core_sampler)", True)
    if params.llama_cpp_samplers:
        name = params.llama_cpp_samplers[0]
        raise InvalidRequest(name, "mistral.rs samples inside its engine, which has none of llama.cpp's "
                             "typical, top-n-sigma, XTC, dynamic-temperature, Mirostat or DRY samplers; drop "
                             "it or use a "
                             "backend whose sampling runs in ruvllm (capabilities.core_sampler)",
                             getattr(params, name))
    if params.penalty_last_n is not None and params.has_penalties:
        raise InvalidRequest("penalty_last_n", "mistral.rs applies its penalties inside its engine over the "
                             "whole sequence, never llama.cpp's window of the last tokens; drop it or use a "
                             "backend whose sampling runs in ruvllm (capabilities.core_sampler)",
                             params.penalty_last_n)
    kwargs: dict[str, Any] = dict(
        # Rendered through the pass-through template: the content is the prompt, verbatim.
        messages=[{"role": "user", "content": prompt_text}],
        model="default",
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        stream=True,
        logprobs=True,
        top_logprobs=max(params.logprobs or 0, 1),
        ignore_eos=params.ignore_eos,
    )
    if banned:
        kwargs["logit_bias"] = {int(t): float("-inf") for t in banned}
    if params.top_p < 1.0:
        kwargs["top_p"] = params.top_p
    if params.top_k > 0:
        kwargs["top_k"] = params.top_k
    if params.min_p > 0.0:
        kwargs["min_p"] = params.min_p
    if params.repetition_penalty != 1.0:
        kwargs["repetition_penalty"] = params.repetition_penalty
    if params.frequency_penalty != 0.0:
        kwargs["frequency_penalty"] = params.frequency_penalty
    if params.presence_penalty != 0.0:
        kwargs["presence_penalty"] = params.presence_penalty
    if adapter is not None:
        kwargs["adapter"] = adapter
    return m.ChatCompletionRequest(**kwargs)
