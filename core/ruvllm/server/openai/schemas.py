"""OpenAI's request bodies (``/v1/chat/completions``, ``/v1/completions``) as pydantic models: this
surface's wire schema, which :mod:`ruvllm.server.openai.translation` translates into the
lifecycle's neutral request as every other surface translates its own.

Every field of every body is honoured, refused with a 400 naming it when set to a value ruvllm
cannot honour (``best_of``, ``suffix``... checked by :mod:`ruvllm.server.openai.translation`), or
accepted for a stated reason (``user``); docs/server.md's "Request fields" table says which, and
tests/server/test_field_table.py fails when a field here has no decision there. Unknown fields
are refused (400 naming them), at any depth: a client that sends ``allowed_token_ids``, a misspelt
option or a misspelt message field must not get a quietly different answer. The numeric ranges
here are the ones the server enforces, so the published OpenAPI schema (which
:mod:`ruvllm.server.openapi` completes with the server's own limits) states the real constraints.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from ruvllm.errors import InvalidRequest
from ruvllm.server.http.chat_messages import ChatMessage, ChatTemplateFields
from ruvllm.server.http.strict_fields import RequestBody, StrictModel
from ruvllm.types import MAX_LOGIT_BIAS, MAX_LOGPROBS

#: Legacy completions cap ``logprobs`` at 5; chat's ``top_logprobs`` at 20.
MAX_COMPLETION_LOGPROBS = 5

_Bias = Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]
_Text = _StopString = Annotated[str, Field(min_length=1)]
_TokenId = Annotated[int, Field(ge=0)]


#: vLLM's ``truncate_prompt_tokens``: a number of tokens, or -1 (the model's limit).
def _not_zero(n: int) -> int:
    if n == 0:
        raise InvalidRequest("truncate_prompt_tokens", "must be -1 (the model's limit) or at least 1; 0 "
                             "would leave nothing", n)
    return n


TruncateTokens = Annotated[int, Field(ge=-1), AfterValidator(_not_zero)]


class CommonRequest(RequestBody):
    """The fields OpenAI's chat and text completion bodies share (with vLLM's extensions)."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: _StopString | list[_StopString] | None = None
    seed: int | None = Field(None, ge=0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    #: OpenAI's end-user id: the request's tenant, which only a learning plugin (SONA) uses: it
    #: learns each tenant's feedback apart (docs/server.md, docs/sona.md).
    user: str | None = None
    # Extensions vLLM users already send.
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0)
    ignore_eos: bool = False
    #: At least this many tokens before the answer may end (GenerationParams.min_tokens).
    min_tokens: int = Field(0, ge=0)
    #: The answer's text with special tokens shown, and with what stopped it (GenerationParams).
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stop_token_ids: list[_TokenId] | None = None
    #: vLLM's names: scheduling priority (LOWER runs first, as in vLLM; needs the engine's
    #: priority policy) and the prefix-cache salt (requests share cached KV only with the same salt).
    priority: int = 0
    cache_salt: str | None = Field(None, min_length=1)
    #: ruvllm's: this request's tokens and logprobs the same whatever runs beside it
    #: (GenerationParams.batch_invariant; refused where the engine cannot keep it).
    batch_invariant: bool = False
    #: vLLM's: the answer carries the prompt's and each choice's token ids (responses.py).
    return_token_ids: bool | None = None
    #: vLLM's: logprobs name each token ``token_id:<id>`` (responses.py).
    return_tokens_as_token_ids: bool | None = None
    #: vLLM's: the prompt cut to this many tokens (-1: the model's context), from
    #: ``truncation_side`` (params.truncated).
    truncate_prompt_tokens: TruncateTokens | None = None
    truncation_side: Literal["left", "right"] | None = None
    #: vLLM's: only these tokens may be chosen (GenerationParams.allowed_token_ids).
    allowed_token_ids: list[_TokenId] | None = Field(None, min_length=1)
    #: vLLM's: words never written, at the start of the answer or after a space
    #: (CompletionService.banned_words).
    bad_words: list[_Text] | None = None
    #: vLLM's: each prompt position's logprobs with this many alternatives (responses.py); not
    #: with ``stream`` (they come with the end of the answer, params.py says).
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    # Constrained decoding extensions (vLLM's names; see docs/structured-output.md).
    structured_outputs: StructuredOutputs | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None
    guided_choice: list[str] | None = None
    guided_json: dict[str, Any] | str | None = None
    #: Token id (as a string, OpenAI's form) -> bias added to its logit before sampling.
    logit_bias: dict[Annotated[str, Field(pattern=r"^[0-9]+$")], _Bias] | None = None
    # OpenAI field ruvllm refuses by name when set other than 1.
    best_of: int | None = None


class StructuredOutputs(StrictModel):
    """vLLM's ``structured_outputs`` (its spelling since v0.12, which removed ``guided_*``): one
    output constraint, as the ``guided_*`` field of the same name, or ``json_object``."""

    json_schema: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    #: Accepted, unused: ruvllm's JSON grammars never allow optional whitespace (compact JSON).
    disable_any_whitespace: bool = False
    #: Accepted, unused: ruvllm's JSON grammars close every object the schema does not open.
    disable_additional_properties: bool = False
    #: Accepted, unused: the server's one grammar engine compiles every constraint, never another.
    disable_fallback: bool = False
    #: Refused unless null (see _no_unserved).
    whitespace_pattern: str | None = None
    structural_tag: str | dict[str, Any] | None = None

    @model_validator(mode="after")
    def _no_unserved(self) -> StructuredOutputs:
        if self.whitespace_pattern is not None:
            raise InvalidRequest("structured_outputs.whitespace_pattern", "is not supported: ruvllm's JSON "
                                 "grammars write compact JSON, with no whitespace to pattern; remove it")
        if self.structural_tag is not None:
            raise InvalidRequest("structured_outputs.structural_tag", "is not supported: ruvllm constrains "
                                 "one whole answer (json, regex, choice or grammar), not tagged spans of it; "
                                 "remove it")
        return self


class StreamOptions(StrictModel):
    include_usage: bool = False
    #: OpenAI pads stream chunks with random ``obfuscation`` text unless this is false; ruvllm
    #: never does, so only false is accepted (params.py refuses true).
    include_obfuscation: bool = False


#: OpenAI's ``metadata``: up to 16 string pairs (keys up to 64 characters, values up to 512).
Metadata = Annotated[dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
                     Field(max_length=16)]


class Prediction(StrictModel):
    """OpenAI's predicted output: the answer the client expects (text, or text parts), whose
    matching tokens are verified as drafts instead of decoded one by one."""

    type: Literal["content"]
    content: str | list[dict[str, Any]]


class ChatCompletionRequest(CommonRequest, ChatTemplateFields):
    messages: list[ChatMessage] = Field(min_length=1)
    #: OpenAI's stored completions: true keeps the answer for ``GET /v1/chat/completions``
    #: (server/openai/chat_store.py).
    store: bool | None = None
    #: OpenAI's processing tier: this server has one, so only ``auto`` and ``default`` (below).
    service_tier: str | None = None
    #: OpenAI's output types: this server writes text only, so only ``["text"]`` (below).
    modalities: list[str] | None = None
    #: Tags kept with a stored completion (``store: true``), which its list filters by.
    metadata: Metadata | None = None
    #: Accepted, unused, as the Responses API's: an end-user id for OpenAI's abuse monitoring
    #: (ruvllm keeps no per-user policy) and a routing hint for OpenAI's prompt cache (the
    #: engine's prefix cache serves every cached prefix by itself).
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prediction: Prediction | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    #: OpenAI's deprecated functions API: ``functions`` / ``function_call`` are ``tools`` /
    #: ``tool_choice`` with one call an answer, which comes back as ``message.function_call``.
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None

    @property
    def legacy_functions(self) -> bool:
        """The request uses the deprecated functions API (its answer is shaped so too)."""
        return self.functions is not None

    @model_validator(mode="after")
    def _functions_as_tools(self) -> ChatCompletionRequest:
        if self.functions is None:
            if self.function_call is not None:
                raise InvalidRequest("function_call", "needs functions (or send tools and tool_choice)")
            return self
        if self.tools is not None or self.tool_choice is not None:
            raise InvalidRequest("functions", "give tools and tool_choice, or the deprecated functions and "
                                 "function_call, not both")
        self.tools = [{"type": "function", "function": f} for f in self.functions]
        call = self.function_call
        self.tool_choice = {"type": "function", "function": call} if isinstance(call, dict) else call
        self.parallel_tool_calls = False  # the functions API answers with one call
        return self

    @model_validator(mode="after")
    def _one_tier_text_only(self) -> ChatCompletionRequest:
        if self.service_tier not in (None, "auto", "default"):
            raise InvalidRequest("service_tier", f"this server has one processing tier, so "
                                 f"{self.service_tier!r} cannot be promised; send auto or default, or leave "
                                 "it out")
        if self.modalities is not None and set(self.modalities) != {"text"}:
            raise InvalidRequest("modalities", f"this server writes text only; got {self.modalities!r}: send "
                                 '["text"], or leave modalities out')
        return self


class CompletionRequest(CommonRequest):
    prompt: (_Text | Annotated[list[_Text], Field(min_length=1)]
             | Annotated[list[_TokenId], Field(min_length=1)]
             | Annotated[list[Annotated[list[_TokenId], Field(min_length=1)]], Field(min_length=1)])
    #: 0 only with ``echo`` (the prompt and its logprobs, nothing generated), as OpenAI allows.
    max_tokens: int | None = Field(None, ge=0)
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    suffix: str | None = None


class EmbeddingRequest(RequestBody):
    """OpenAI's fields; any other is a 400 naming it (a misspelt ``encoding_fromat`` must not
    quietly give floats), as on every endpoint."""

    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    #: Refused when set (check_dimensions says why).
    dimensions: int | None = None
    #: OpenAI's end-user id: accepted, never used (docs/server.md says why).
    user: str | None = None
    #: vLLM's: each input cut to this many tokens (-1: the embedding limit), from
    #: ``truncation_side`` (params.truncated); left out, a longer input is a 400.
    truncate_prompt_tokens: TruncateTokens | None = None
    truncation_side: Literal["left", "right"] | None = None


CommonRequest.model_rebuild()
ChatCompletionRequest.model_rebuild()
CompletionRequest.model_rebuild()
