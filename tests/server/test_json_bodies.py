"""A JSON body declared as a form (``curl -d``) or as plain text (``fetch`` with a string) is read
as JSON, as Ollama and llama-server read it: their documentation's examples send it that way."""

from __future__ import annotations

import json

import httpx
import pytest
from server_helpers import API_KEY

BODIES = {
    "/api/generate": {"model": "default", "prompt": "Hi", "stream": False, "options": {"num_predict": 2}},
    "/completion": {"prompt": "Hi", "n_predict": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
}


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain;charset=UTF-8"])
@pytest.mark.parametrize("path", sorted(BODIES))
def test_a_json_body_under_another_declared_type_is_read_as_json(server, path, content_type):
    r = httpx.post(server.url + path, content=json.dumps(BODIES[path]), timeout=60,
                   headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": content_type})
    assert r.status_code == 200, r.text


def test_a_form_that_is_not_json_is_a_400_saying_so(server):
    r = httpx.post(server.url + "/completion", content="prompt=Hi&n_predict=2", timeout=60,
                   headers={"Authorization": f"Bearer {API_KEY}",
                            "Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"], r.text
