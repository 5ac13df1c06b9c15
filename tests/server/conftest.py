"""Session fixtures: one real server (API key, small body limit) shared by the server tests."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from server_helpers import API_KEY, SHORT_EMBEDDING_TOKENS, RunningServer, start_server


@pytest.fixture(scope="session")
def server() -> Iterator[RunningServer]:
    running = start_server(server={"max_body_bytes": 64 * 1024, "max_tokens_limit": 512})
    yield running
    running.stop()


@pytest.fixture(scope="session")
def client(server: RunningServer):
    return openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def model_name(client) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="session")
def short_embedding_server() -> Iterator[RunningServer]:
    """A server whose embedding inputs hold at most SHORT_EMBEDDING_TOKENS, for the tests of
    cutting an input to the limit: the rule is the same at any limit, and at the default 512 each
    vector took 2 s on a 2-core host (a 512-token prefill took 1.6 s there)."""
    running = start_server(backend_options={"embedding_tokens": SHORT_EMBEDDING_TOKENS})
    yield running
    running.stop()
