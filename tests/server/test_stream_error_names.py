"""An error inside a stream names a field the client sent, on every surface, in that surface's shape.

Each surface reshapes a failure after its stream started in one place (its ``stream_error``),
through the same field table as its refusals before anything runs. Here each is handed a refusal
of the shared request (``max_tokens``, ``tools[0].function.parameters``, ``prompt``) and the field
it names must be found in the body that surface's client sent.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from ruvllm.errors import InvalidRequest
from ruvllm.server.anthropic import messages_api
from ruvllm.server.anthropic.messages_api import MessagesRequest
from ruvllm.server.llama_server import llama_server_api
from ruvllm.server.ollama import ollama_api
from ruvllm.server.openai import delivery, responses_output
from ruvllm.server.openai.responses_api import translate
from ruvllm.server.openai.responses_schema import ResponsesRequest
from ruvllm.server.openai.translation import CHAT_NAMES, COMPLETION_NAMES

TOOL = {"name": "get_weather", "input_schema": {"type": "object"}}


def sent_field(body: Any, path: str) -> bool:
    """Whether ``path`` (``a.b[1].c``) names a field of ``body``."""
    for name, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path):
        if name:
            if not isinstance(body, dict) or name not in body:
                return False
            body = body[name]
        else:
            if not isinstance(body, list) or int(index) >= len(body):
                return False
            body = body[int(index)]
    return True


def _sse_data(event: str) -> dict[str, Any]:
    return json.loads(next(line for line in event.splitlines() if line.startswith("data: "))[6:])


def _openai_chat(core: str) -> tuple[dict[str, Any], str]:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    event = delivery.stream_error(InvalidRequest(core, "refused"), CHAT_NAMES)
    return body, _sse_data(event)["error"]["param"]


def _openai_completion(core: str) -> tuple[dict[str, Any], str]:
    body = {"model": "m", "prompt": "hi", "max_tokens": 4}
    event = delivery.stream_error(InvalidRequest(core, "refused"), COMPLETION_NAMES)
    return body, _sse_data(event)["error"]["param"]


def _responses(core: str) -> tuple[dict[str, Any], str]:
    body = {"model": "m", "input": "hi", "max_output_tokens": 4}
    names = translate(ResponsesRequest(**body)).names
    return body, responses_output.stream_error(InvalidRequest(core, "refused"), names)["param"]


def _anthropic(core: str) -> tuple[dict[str, Any], str]:
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tools": [TOOL]}
    names = messages_api.chat_request(MessagesRequest(**body))[1]
    event = _sse_data(messages_api.stream_error(InvalidRequest(core, "refused"), names))
    assert event["type"] == "error" and event["error"]["type"] == "invalid_request_error", event
    return body, event["error"]["message"].split(":", 1)[0]


def _ollama(core: str) -> tuple[dict[str, Any], str]:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 4}}
    names = ollama_api.ollama_names("messages")
    line = json.loads(ollama_api.stream_error(InvalidRequest(core, "refused"), names))
    return body, line["error"].split(":", 1)[0]


def _llama_server(core: str) -> tuple[dict[str, Any], str]:
    body = {"prompt": "hi", "n_predict": 4}
    error = llama_server_api.stream_error(InvalidRequest(core, "refused"), llama_server_api.llama_names())
    assert error["error"]["code"] == 400, error
    return body, error["error"]["param"]


@pytest.mark.parametrize(("surface", "core"), [
    (_openai_chat, "prompt"), (_openai_chat, "max_tokens"), (_openai_completion, "max_tokens"),
    (_openai_completion, "prompt"), (_responses, "max_tokens"), (_responses, "prompt"),
    (_anthropic, "max_tokens"), (_anthropic, "tools[0].function.parameters"), (_anthropic, "prompt"),
    (_ollama, "max_tokens"), (_ollama, "prompt"), (_llama_server, "max_tokens"), (_llama_server, "prompt"),
])
def test_an_error_inside_a_stream_names_a_field_the_client_sent(surface, core):
    body, named = surface(core)
    assert sent_field(body, named), f"{surface.__name__} named {named!r}, which its client did not send"
