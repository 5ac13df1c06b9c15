"""OpenAI's chat and text completion bodies as the lifecycle's neutral request.

OpenAI's surface translates its body exactly as Anthropic's, Ollama's, llama-server's and the
Responses API's translate theirs: into a :class:`~ruvllm.server.lifecycle.request_input.ChatInput`
or :class:`~ruvllm.server.lifecycle.request_input.RequestInput`. What is OpenAI's own is checked
here, naming its field: ``best_of``, ``stream_options`` without ``stream``, ``top_logprobs``
without ``logprobs``, ``echo`` with ``suffix``, ``max_tokens: 0`` without ``echo``,
``prompt_logprobs`` in a stream; its three spellings of one output constraint
(``response_format``, vLLM's ``structured_outputs`` and the ``guided_*`` fields it replaced) become
one grammar; its messages become the chat template's
(:func:`~ruvllm.server.http.chat_messages.message_dicts`).
"""

from __future__ import annotations

from typing import Any

from ruvllm.errors import InvalidRequest
from ruvllm.guided.grammar import GrammarSpec, from_extensions, from_response_format, from_structured_outputs
from ruvllm.guided.request import one_constraint
from ruvllm.server.http.chat_messages import content_text, message_dicts
from ruvllm.server.http.field_names import FieldNames
from ruvllm.server.lifecycle.request_input import ChatInput, RequestInput, Sampling
from ruvllm.server.openai.schemas import ChatCompletionRequest, CommonRequest, CompletionRequest

#: Chat's refusals in its own body's names: the prompt a chat request is rendered into is its
#: ``messages`` (a context overflow names the prompt), as the other surfaces' tables say too.
_CHAT_FIELDS = {"prompt": "messages"}
CHAT_NAMES = FieldNames.of(_CHAT_FIELDS)

#: A text completion's fields are the neutral request's own.
COMPLETION_NAMES = FieldNames.of({})


def chat_names(body: ChatCompletionRequest) -> FieldNames:
    """The neutral request's fields as this chat body sent them (:data:`CHAT_NAMES`), with
    ``max_tokens`` its ``max_completion_tokens`` where it sent that and ``logprobs`` its
    ``top_logprobs`` where it asked for alternatives."""
    table = dict(_CHAT_FIELDS)
    if body.max_completion_tokens is not None:
        table["max_tokens"] = "max_completion_tokens"
    if body.top_logprobs:
        table["logprobs"] = "top_logprobs"
    return FieldNames.of(table)


def chat_input(body: ChatCompletionRequest) -> ChatInput:
    """The conversation ``body`` asks the lifecycle to answer."""
    _check_common(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidRequest("top_logprobs", "needs logprobs: true")
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    prediction = content_text(body.prediction.content, "prediction") if body.prediction is not None else None
    return ChatInput(
        messages=message_dicts(body.messages), tools=body.tools, tool_choice=body.tool_choice,
        parallel_tool_calls=body.parallel_tool_calls, template=body.template_options(),
        prediction=prediction, truncate_prompt_tokens=body.truncate_prompt_tokens,
        truncation_side=body.truncation_side,
        grammar=one_constraint(from_response_format(body.response_format), _extensions(body)),
        **_common(body, _sampling(body, max_tokens, logprobs, _prompt_logprobs(body, None))))


def completion_input(body: CompletionRequest) -> RequestInput:
    """What ``body`` asks of each of its prompts (which the surface makes token ids of)."""
    _check_common(body)
    if body.suffix and body.echo:
        raise InvalidRequest("echo", "cannot be used with suffix: a fill-in-the-middle prompt is not the "
                             "text sent (OpenAI refuses the pair too); leave one out")
    if body.max_tokens == 0 and not body.echo:
        raise InvalidRequest("max_tokens", "may be 0 only with echo: true (to score the prompt); got 0")
    # OpenAI's echo + logprobs: the prompt's logprobs too.
    echoed = body.logprobs if body.echo else None
    return RequestInput(grammar=_extensions(body),
                        **_common(body, _sampling(body, body.max_tokens, body.logprobs,
                                                  _prompt_logprobs(body, echoed))))


def _check_common(body: CommonRequest) -> None:
    if body.best_of not in (None, 1):
        raise InvalidRequest("best_of", "is not supported by ruvllm; use n for several completions")
    if body.stream_options is not None and not body.stream:
        raise InvalidRequest("stream_options", "is only allowed when stream is true")
    if body.stream_options is not None and body.stream_options.include_obfuscation:
        raise InvalidRequest("stream_options.include_obfuscation", "ruvllm does not pad stream chunks with "
                             "OpenAI's random obfuscation field; leave it out (or false), and serve over TLS "
                             "or loopback")


def _prompt_logprobs(body: CommonRequest, echoed: int | None) -> int | None:
    """vLLM's ``prompt_logprobs`` (not in a stream), or as many as ``echo`` asks for, the larger."""
    if body.prompt_logprobs is None:
        return echoed
    if body.stream:
        raise InvalidRequest("prompt_logprobs", "cannot be streamed: the prompt's logprobs reach the server "
                             "with the end of the answer; ask without stream (or use echo with logprobs on "
                             "/v1/completions, whose stream sends them first)")
    return max(body.prompt_logprobs, echoed or 0)


def _sampling(body: CommonRequest, max_tokens: int | None, logprobs: int | None,
              prompt_logprobs: int | None) -> Sampling:
    return Sampling(
        max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
        min_p=body.min_p, repetition_penalty=body.repetition_penalty, presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty, stop=body.stop, seed=body.seed, ignore_eos=body.ignore_eos,
        min_tokens=body.min_tokens, skip_special_tokens=body.skip_special_tokens,
        include_stop_str_in_output=body.include_stop_str_in_output, stop_token_ids=body.stop_token_ids,
        logit_bias=body.logit_bias, allowed_token_ids=body.allowed_token_ids, bad_words=body.bad_words,
        logprobs=logprobs, prompt_logprobs=prompt_logprobs, batch_invariant=body.batch_invariant)


def _common(body: CommonRequest, sampling: Sampling) -> dict[str, Any]:
    """The neutral fields every OpenAI body sets the same way (``user`` is the tenant)."""
    return {"n": body.n, "sampling": sampling, "tenant": body.user, "priority": body.priority,
            "cache_salt": body.cache_salt}


def _extensions(body: CommonRequest) -> GrammarSpec | None:
    """vLLM's constraint fields: ``structured_outputs`` or the ``guided_*`` fields it replaced."""
    guided = from_extensions(guided_regex=body.guided_regex, guided_grammar=body.guided_grammar,
                             guided_choice=body.guided_choice, guided_json=body.guided_json)
    so = body.structured_outputs
    if so is None:
        return guided
    return one_constraint(guided, from_structured_outputs(json_schema=so.json_schema, regex=so.regex,
                                                          choice=so.choice, grammar=so.grammar,
                                                          json_object=so.json_object))
