"""No 5xx for any body, on any surface: schemathesis fuzzes every operation of the server's own
/openapi.json (issue 62).

The schema names every surface (OpenAI's, Anthropic's, Ollama's, llama-server's, the batch and
stored-object APIs; the first test fails if one drops out of it), so one test covers them all:
schemathesis' coverage phase sends each operation its boundary cases and malformed bodies (wrong
types, missing fields, objects where strings belong: about 8,200 requests), then a few random
bodies each, valid and not. A bad input is the client's error, a 4xx in that surface's shape; a
5xx means the server broke on it, which is what this looks for. 501 is not a break: Ollama's
``/api/delete`` and the like answer it on purpose, saying why (docs/server.md).

The server answers at most one token, holds at most 128 tokens of context and embeds at most 32,
so a valid body costs little more than a malformed one: the file takes about a minute on two
cores. The random part is seeded (``derandomize``), so a failure repeats.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from server_helpers import API_KEY, RunningServer, start_server

HEADERS = {"Authorization": f"Bearer {API_KEY}"}

#: One of the longest files (34-60 s of one worker, pinned): handed out with the first units
#: (tests/conftest.py), not last in collection order, so that the run ends on short ones.
pytestmark = pytest.mark.long_unit


@pytest.fixture(scope="module")
def fuzzed_server() -> Iterator[RunningServer]:
    running = start_server(server={"max_tokens_limit": 1, "max_n": 1}, max_context=128,
                           backend_options={"embedding_tokens": 32})
    yield running
    running.stop()


@pytest.fixture(scope="module")
def served_schema(fuzzed_server: RunningServer):
    return schemathesis.openapi.from_url(fuzzed_server.url + "/openapi.json", headers=HEADERS)


schema = schemathesis.pytest.from_fixture("served_schema")
#: A path of each surface: the fuzzing below reaches only what the schema lists.
SURFACES = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/conversations", "/v1/messages",
            "/v1/messages/count_tokens", "/v1/messages/batches", "/v1/batches", "/v1/embeddings", "/api/chat",
            "/api/generate", "/completion", "/infill", "/v2/rerank", "/tokenize"]


def test_every_surface_is_in_the_schema(served_schema):
    assert [p for p in SURFACES if p not in served_schema.raw_schema["paths"]] == []


@schema.parametrize()
@settings(max_examples=5, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_no_body_breaks_the_server(case, fuzzed_server):
    response = case.call(base_url=fuzzed_server.url, headers=HEADERS, timeout=60)
    assert response.status_code < 500 or response.status_code == 501, \
        f"{case.method} {case.formatted_path} answered {response.status_code}: {response.text[:500]}\n" \
        f"{case.as_curl_command(headers=HEADERS)}"
