"""OpenAI's chat message on the wire, which three surfaces take: OpenAI's chat (and its stored
completions), vLLM's ``/tokenize`` and llama-server's ``/apply-template``.

It lives beneath the surfaces, beside the other wire pieces they share, because those three accept
the same JSON for a conversation and none of them may import another. :func:`message_dicts`
turns it into the lifecycle's messages (what chat templates read: role, content text, and where
set ``name``, ``tool_calls`` with arguments objects, ``tool_call_id``), refusing by name what
cannot be rendered. Anthropic's, Ollama's and the Responses API's conversations never pass
through here: each surface writes those messages from its own body.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NoReturn

from pydantic import BaseModel

from ruvllm.chat import TemplateOptions
from ruvllm.errors import InvalidRequest
from ruvllm.server.http.strict_fields import StrictModel


class ChatMessage(StrictModel):
    """One message, with the fields the ``openai`` client's message types carry (and an OpenAI
    response message replayed as history: ``message.model_dump()``); :func:`message_dicts` turns
    it into what the chat template reads and refuses what it cannot render."""

    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    #: An assistant turn's calls: a list of ``{"type": "function", "function": ...}`` (checked
    #: by message_dicts, which names what is malformed).
    tool_calls: Any = None
    tool_call_id: str | None = None
    #: An assistant turn's refusal text (rendered as its content).
    refusal: str | None = None
    #: Accepted only as null: a reference to an earlier audio answer.
    audio: dict[str, Any] | None = None
    #: An assistant turn's call in the deprecated functions API (``{"name", "arguments"}``),
    #: rendered as its one tool call; a ``function`` message after it is that call's answer.
    function_call: dict[str, Any] | None = None
    #: URL citations of an earlier OpenAI answer: accepted, not rendered (docs/server.md).
    annotations: list[Any] | None = None


class ChatTemplateFields(BaseModel):
    """vLLM's fields for how the messages become a prompt (ruvllm.chat.TemplateOptions), shared by
    chat, ``/tokenize`` and ``/apply-template`` so that a count or a rendering is the chat request's."""

    #: More variables for the model's chat template (Qwen3's ``enable_thinking``).
    chat_template_kwargs: dict[str, Any] | None = None
    #: End the prompt with the header of a new answer (default: unless the final message is continued).
    add_generation_prompt: bool | None = None
    #: Leave the final message open for the model to continue (default: a final assistant message).
    continue_final_message: bool | None = None

    def template_options(self) -> TemplateOptions:
        return TemplateOptions(self.add_generation_prompt, self.continue_final_message,
                               self.chat_template_kwargs)


def message_dicts(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Plain dicts for the chat template: text content parts joined, an assistant's ``refusal``
    as its content, ``tool_calls`` with their arguments as objects, a ``developer`` turn (what
    OpenAI's newer clients send for instructions) as the system turn chat templates know. The
    deprecated functions API's turns are the tool turns they stand for: an assistant's
    ``function_call`` its one tool call, a ``function`` message that call's answer. What cannot be
    rendered (image or audio parts, a reference to an audio answer) is a 400 naming it, never
    dropped."""
    out = []
    legacy_call: str | None = None
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if m.audio is not None:
            _refuse(f"{at}.audio", _AUDIO_REFERENCE)
        content = content_text(m.content, at)
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


def content_text(content: str | list[dict[str, Any]] | None, at: str) -> str:
    """A message's content (or a predicted output's) as one string: text parts joined; any other
    part, or a key a text part does not have, is a 400 naming it (``at``: the field)."""
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


def _refuse(field: str, why: str) -> NoReturn:
    raise InvalidRequest(field, why)
