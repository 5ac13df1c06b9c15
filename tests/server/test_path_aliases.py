"""llama-server's other paths (``/chat/completions``, ``/responses``, ``/models``,
``/v1/health``, ``/completions``) answer as their routes do: an ``openai`` client whose base URL
lacks ``/v1``, as it is often pointed at llama-server, chats, lists models and uses the Responses
API unchanged (``/completions`` is llama-server's ``/completion``, as in llama-server)."""

from __future__ import annotations

import httpx
import openai
import pytest
from server_helpers import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
MESSAGES = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def bare_client(server):
    return openai.OpenAI(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=120)


def test_openai_client_without_v1(bare_client, client, model_name):
    assert [m.id for m in bare_client.models.list().data] == [m.id for m in client.models.list().data]
    asked = {"model": model_name, "messages": MESSAGES, "max_tokens": 6, "temperature": 0}
    assert bare_client.chat.completions.create(**asked).choices[0].message.content == \
        client.chat.completions.create(**asked).choices[0].message.content
    said = {"model": model_name, "input": "Name a colour.", "max_output_tokens": 6, "temperature": 0,
            "store": False}
    assert bare_client.responses.create(**said).output_text == client.responses.create(**said).output_text


def test_completions_is_llama_servers_completion(server):
    body = {"prompt": "One, two, three,", "n_predict": 4, "temperature": 0}
    alias = httpx.post(server.url + "/completions", json=body, headers=AUTH, timeout=120).json()
    route = httpx.post(server.url + "/completion", json=body, headers=AUTH, timeout=120).json()
    assert alias["content"] == route["content"] and alias["stop_type"] == route["stop_type"]


def test_health_needs_no_key_and_aliases_keep_the_routes_checks(server):
    assert httpx.get(server.url + "/v1/health", timeout=30).json() == {"status": "ok"}
    url = server.url + "/chat/completions"
    assert httpx.post(url, json={"messages": MESSAGES}, timeout=30).status_code == 401
    r = httpx.post(url, json={"messages": MESSAGES, "max_tokenz": 2}, headers=AUTH, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokenz", r.text
