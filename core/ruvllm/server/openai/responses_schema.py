"""The Responses API's request body (``POST /v1/responses``) as pydantic models.

The shapes are the ``openai`` SDK's (``ResponseCreateParams``, its input items and tools), each
object strict, so that a field ruvllm does not know is a 400 naming it (schemas.py). What a valid
Responses body may hold and ruvllm does not serve (built-in tools and their items, image, file
and audio parts) is refused before parsing, naming it and why, rather than as "no such tag";
the decisions about the fields that remain are :mod:`ruvllm.server.openai.responses_api`'s.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from ruvllm.errors import InvalidRequest
from ruvllm.server.http.strict_fields import RequestBody, StrictModel, type_tag
from ruvllm.server.openai.schemas import Metadata
from ruvllm.types import MAX_LOGPROBS

_Text = Annotated[str, Field(min_length=1)]
#: The status an earlier output item was returned with: accepted when it is replayed as input.
_Status = Literal["in_progress", "completed", "incomplete"]


class InputText(StrictModel):
    type: Literal["input_text"]
    text: str


class OutputText(StrictModel):
    """An earlier answer's text, replayed as history (``response.output`` sent back)."""

    type: Literal["output_text"]
    text: str
    #: Citations into that text: accepted, not rendered (as chat's ``annotations``).
    annotations: list[Any] | None = None
    #: That text's logprobs: accepted, not rendered (history is text).
    logprobs: list[Any] | None = None


class RefusalPart(StrictModel):
    """An earlier answer's refusal: rendered as that turn's text (as chat's ``refusal``)."""

    type: Literal["refusal"]
    refusal: str


Part = Annotated[Annotated[InputText, Tag("type=input_text")] | Annotated[OutputText, Tag("type=output_text")]
                 | Annotated[RefusalPart, Tag("type=refusal")], Discriminator(type_tag)]


class _InputItem(StrictModel):
    """An item of ``input``; one the server answered earlier comes back with its id and status:
    accepted, unused (nothing is looked up by id)."""

    id: str | None = None
    status: _Status | None = None


class MessageItem(_InputItem):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]


class FunctionCallItem(_InputItem):
    """A call the model made earlier (an output item sent back): the assistant's tool call."""

    type: Literal["function_call"]
    call_id: _Text
    name: _Text
    arguments: str


class FunctionCallOutputItem(_InputItem):
    """The result of a call, rendered as the tool's answer to it."""

    type: Literal["function_call_output"]
    call_id: _Text
    output: str | list[InputText]


class SummaryText(StrictModel):
    type: Literal["summary_text"]
    text: str


class ReasoningText(StrictModel):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(_InputItem):
    """An earlier answer's reasoning, sent back: accepted and dropped on every model (thinking
    templates render earlier answers without their thinking; a model that does not think has no
    place for it)."""

    type: Literal["reasoning"]
    summary: list[SummaryText]
    content: list[ReasoningText] | None = None
    #: Encrypted reasoning (OpenAI's, for ``store: false``): ruvllm never writes any.
    encrypted_content: str | None = None


class ItemReference(StrictModel):
    """An item of a stored response (its input or output) or of a conversation, by its id: the
    Responses route puts the item itself in its place (responses_api.resolved)."""

    type: Literal["item_reference"]
    id: _Text


Item = Annotated[Annotated[MessageItem, Tag("type=message")]
                 | Annotated[FunctionCallItem, Tag("type=function_call")]
                 | Annotated[FunctionCallOutputItem, Tag("type=function_call_output")]
                 | Annotated[ReasoningItem, Tag("type=reasoning")],
                 Discriminator(lambda v: type_tag(v, "message"))]
#: ``input``'s items: an item, or a reference to a stored one.
InputItem = Annotated[Annotated[MessageItem, Tag("type=message")]
                      | Annotated[FunctionCallItem, Tag("type=function_call")]
                      | Annotated[FunctionCallOutputItem, Tag("type=function_call_output")]
                      | Annotated[ReasoningItem, Tag("type=reasoning")]
                      | Annotated[ItemReference, Tag("type=item_reference")],
                      Discriminator(lambda v: type_tag(v, "message"))]


class FunctionTool(StrictModel):
    type: Literal["function"]
    name: _Text
    description: str | None = None
    parameters: dict[str, Any] | None = None
    #: Arguments that follow ``parameters``: what ruvllm gives wherever it constrains the calls;
    #: ``true`` is refused where it does not (:func:`check_strict`).
    strict: bool | None = None


class FunctionChoice(StrictModel):
    type: Literal["function"]
    name: _Text


#: A mode by name, or one function. (Tagged, so that an error's path is ``tool_choice.name``, not
#: pydantic's label for the branch.)
ToolChoice = Annotated[Annotated[Literal["auto", "none", "required"], Tag("type=option")]
                       | Annotated[FunctionChoice, Tag("type=function")],
                       Discriminator(lambda v: "type=option" if isinstance(v, str) else type_tag(v))]


class TextFormat(StrictModel):
    type: Literal["text"]


class JsonObjectFormat(StrictModel):
    type: Literal["json_object"]


class JsonSchemaFormat(StrictModel):
    type: Literal["json_schema"]
    name: _Text
    schema_: dict[str, Any] = Field(alias="schema")
    #: Accepted, unused: the schema constrains the answer; it is not shown to the model.
    description: str | None = None
    #: Accepted, unused: the answer always follows the schema (a grammar enforces it).
    strict: bool | None = None


Format = Annotated[Annotated[TextFormat, Tag("type=text")]
                   | Annotated[JsonObjectFormat, Tag("type=json_object")]
                   | Annotated[JsonSchemaFormat, Tag("type=json_schema")], Discriminator(type_tag)]


class TextConfig(StrictModel):
    #: ``text`` (plain), or structured output: ``json_object``, ``json_schema`` (as chat's
    #: ``response_format``).
    format: Format | None = None


class Reasoning(StrictModel):
    """No effort can be set and nothing is summarised: a thinking model thinks as its chat
    template has it, and its reasoning comes back whole (responses_api.reasoning_shown)."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


#: ``include`` values: the one that adds output (logprobs), and the one that asks for what ruvllm
#: never produces (encrypted reasoning, which Codex-style clients send with ``store: false``).
LOGPROBS_INCLUDE = "message.output_text.logprobs"
NOTHING_TO_INCLUDE = "reasoning.encrypted_content"
_ITEM_REFUSALS = {
    "item_reference": "a conversation keeps items, not references to them; send the item itself",
}
_PART_TYPES = {"message": ("content", {"input_text", "output_text", "refusal"}),
               "function_call_output": ("output", {"input_text"}),
               "reasoning": ("content", {"reasoning_text"})}


def _other_type(value: Any, *served: str) -> bool:
    """Whether ``value`` is an object of a named type other than ``served`` (one with no type is
    left to the schema, which says what is missing)."""
    return isinstance(value, dict) and isinstance(value.get("type"), str) and value["type"] not in served


def _refuse_unserved(data: Any) -> Any:
    """Name what a valid Responses body may hold and ruvllm does not serve (built-in tools, their
    items, non-text parts) before parsing, so that the 400 says why rather than "no such tag"."""
    if not isinstance(data, dict):
        return data
    hosted = ("ruvllm runs no built-in tools; declare it as a function tool "
              "({\"type\": \"function\", \"name\", \"parameters\"}) and run it yourself")
    for i, tool in enumerate(data.get("tools") or []):
        if _other_type(tool, "function"):
            raise InvalidRequest(f"tools[{i}].type", f"{tool['type']!r} is not served: {hosted}")
    choice = data.get("tool_choice")
    if _other_type(choice, "function"):
        raise InvalidRequest("tool_choice.type", f"{choice['type']!r} is not served: tool_choice is auto, "
                             "none, required or {\"type\": \"function\", \"name\": ...} (ruvllm runs no "
                             "built-in tools)")
    refuse_unserved_items(data.get("input"), "input", references=True)
    return data


def refuse_unserved_items(items: Any, field: str, *, references: bool = False) -> None:
    """Name an item (of ``field``, a list) or a part of one that ruvllm does not serve;
    ``references``: ``item_reference`` items are served there."""
    served = ("message", "function_call", "function_call_output", "reasoning",
              *(("item_reference",) if references else ()))
    for i, item in enumerate(items if isinstance(items, list) else []):
        if _other_type(item, *served):
            kind = item["type"]
            why = _ITEM_REFUSALS.get(kind, "they belong to built-in tools, which ruvllm does not run")
            raise InvalidRequest(f"{field}[{i}].type", f"{kind!r} items are not served: {why}")
        kind = item.get("type", "message") if isinstance(item, dict) else None
        # A type that is not a string is left to the schema, which names it (it is no key here).
        name, allowed = _PART_TYPES.get(kind, ("", set())) if isinstance(kind, str) else ("", set())
        parts = item.get(name) if name else None
        for j, part in enumerate(parts if isinstance(parts, list) else []):
            if _other_type(part, *allowed):
                kinds = ", ".join(sorted(allowed))
                raise InvalidRequest(f"{field}[{i}].{name}[{j}].type", f"{part.get('type')!r} parts are not "
                                     f"served: ruvllm serves text models ({kinds} parts)")


class ResponsesRequest(RequestBody):
    model: str | None = None
    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    include: list[str] | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool = False
    #: Whether the response is kept (responses_api: previous_response_id, GET, background).
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    metadata: Metadata | None = None
    #: The end user: the request's tenant, as chat's ``user`` (responses_api.translate).
    user: str | None = None
    #: Accepted, unused: an id for OpenAI's abuse monitoring; ruvllm keeps no per-user policy.
    safety_identifier: str | None = None
    #: Accepted, unused: the engine's prefix cache serves every prompt's cached prefix by itself.
    prompt_cache_key: str | None = None
    reasoning: Reasoning | None = None
    truncation: Literal["auto", "disabled"] | None = None
    # Chat's sampling extensions, which llama-server and vLLM users send on this route too.
    seed: int | None = Field(None, ge=0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0)

    @model_validator(mode="before")
    @classmethod
    def _served_kinds_only(cls, data: Any) -> Any:
        return _refuse_unserved(data)
