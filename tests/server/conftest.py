"""Session fixtures: one real server (API key, small body limit) shared by the server tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from server_helpers import API_KEY, RunningServer, start_server


@pytest.fixture(scope="session")
def server() -> Iterator[RunningServer]:
    running = start_server(server={"max_body_bytes": 64 * 1024, "max_tokens_limit": 512})
    yield running
    running.stop()


@pytest.fixture(scope="session")
def client(server: RunningServer):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def model_name(client) -> str:
    return client.models.list().data[0].id
