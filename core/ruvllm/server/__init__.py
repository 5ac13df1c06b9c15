"""ruvllm's OpenAI-compatible HTTP server (FastAPI + uvicorn) over an AsyncEngine."""

from ruvllm.server.app import ServerSettings, create_app
from ruvllm.server.lifecycle.params import Limits

__all__ = ["Limits", "ServerSettings", "create_app"]
