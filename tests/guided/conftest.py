"""The constrained-decoding tests use the server tests' real server (llamacpp backend, embedded
SmolLM2) and openai client fixtures, loaded from tests/server/conftest.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_SERVER_TESTS = Path(__file__).resolve().parent.parent / "server"
sys.path.insert(0, str(_SERVER_TESTS))
_spec = importlib.util.spec_from_file_location("ruvllm_server_test_fixtures", _SERVER_TESTS / "conftest.py")
assert _spec is not None and _spec.loader is not None
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)

server = _fixtures.server
client = _fixtures.client
model_name = _fixtures.model_name


@pytest.fixture(scope="session")
def oai(client):
    """The server tests' client with room for 20 concurrent constrained requests on a busy CPU."""
    return client.with_options(timeout=280)
