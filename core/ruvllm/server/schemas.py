"""OpenAI request bodies as pydantic models.

Only fields ruvllm honours are typed; known OpenAI fields it cannot honour are accepted by the
schema and rejected by :mod:`ruvllm.server.params` with a 400 that names them, so a client never
gets silently different behaviour. Unknown fields are refused too (400 naming them): a client that
sends ``prompt_logprobs`` or a misspelt option must not get a quietly different answer. The
numeric ranges here are the ones the server enforces, so the published OpenAPI schema (which
:mod:`ruvllm.server.openapi` completes with the server's own limits) states the real constraints.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ruvllm.server.strict_fields import refuse_unknown_fields
from ruvllm.types import MAX_LOGIT_BIAS, MAX_LOGPROBS

#: Legacy completions cap ``logprobs`` at 5; chat's ``top_logprobs`` at 20.
MAX_COMPLETION_LOGPROBS = 5

_Bias = Annotated[float, Field(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS)]
_Text = _StopString = Annotated[str, Field(min_length=1)]
_TokenId = Annotated[int, Field(ge=0)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_fields_only(cls, data: Any) -> Any:
        return refuse_unknown_fields(cls, data)

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
    user: str | None = None
    # Extensions vLLM users already send.
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0)
    ignore_eos: bool = False
    stop_token_ids: list[_TokenId] | None = None
    #: vLLM's names: scheduling priority (LOWER runs first, as in vLLM; needs the engine's
    #: priority policy) and the prefix-cache salt (requests share cached KV only with the same salt).
    priority: int = 0
    cache_salt: str | None = Field(None, min_length=1)
    # Constrained decoding extensions (vLLM's names; see docs/structured-output.md).
    guided_regex: str | None = None
    guided_grammar: str | None = None
    guided_choice: list[str] | None = None
    guided_json: dict[str, Any] | str | None = None
    #: Token id (as a string, OpenAI's form) -> bias added to its logit before sampling.
    logit_bias: dict[Annotated[str, Field(pattern=r"^[0-9]+$")], _Bias] | None = None
    # OpenAI field ruvllm refuses by name when set other than 1.
    best_of: int | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None


class CompletionRequest(_Request):
    prompt: (_Text | Annotated[list[_Text], Field(min_length=1)]
             | Annotated[list[_TokenId], Field(min_length=1)]
             | Annotated[list[Annotated[list[_TokenId], Field(min_length=1)]], Field(min_length=1)])
    #: 0 only with ``echo`` (the prompt and its logprobs, nothing generated), as OpenAI allows.
    max_tokens: int | None = Field(None, ge=0)
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    suffix: str | None = None


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    tokens: list[int]


_Request.model_rebuild()
ChatCompletionRequest.model_rebuild()
CompletionRequest.model_rebuild()
