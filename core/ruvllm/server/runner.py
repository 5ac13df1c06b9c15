"""Load the engine, build the app and run uvicorn: what ``ruvllm serve`` does.

The model is loaded *before* the socket is bound, so a model that cannot load makes the command
fail with the reason; nothing is ever served in its place.
"""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Mapping
from typing import Any

import attrs

from ruvllm.config import Config
from ruvllm.errors import ConfigError
from ruvllm.server.app import ServerSettings, create_app
from ruvllm.server.params import Limits
from ruvllm.serving import AsyncEngine

log = logging.getLogger(__name__)


def load_engine(config: Config, engine_options: Mapping[str, Any] | None = None) -> AsyncEngine:
    """The batching ServingEngine on the configured backend and model (loaded now)."""
    from ruvllm.engine import ServingEngine

    return ServingEngine.from_config(config, options=dict(engine_options) if engine_options else None)


def settings_for(config: Config, engine: AsyncEngine, *, served_name: str | None = None,
                 max_context: int | None = None) -> ServerSettings:
    name = served_name or engine.info.name
    aliases = tuple({config.model, engine.info.name} - {name})
    srv = config.server
    return ServerSettings(model_name=name, aliases=aliases, api_key=srv.api_key or None,
                          max_body_bytes=srv.max_body_bytes,
                          limits=Limits(max_tokens=srv.max_tokens_limit, max_n=srv.max_n,
                                                max_context=max_context))


def startup_banner(engine: AsyncEngine, settings: ServerSettings) -> str:
    """What ``ruvllm serve`` prints before it listens: the model and backend, how many tokens one
    request may use, and the memory the backend sized from a setting (its KV cache), so that a
    window smaller than the model's or a large allocation is never a surprise."""
    room = settings.limits.context_length(engine.info.context_length)
    lines = [f"ruvllm: serving {settings.model_name} with backend {engine.backend_name} "
             f"({engine.path} path); prompt + max_tokens of one request: up to {room} tokens"]
    backend = getattr(engine, "backend", None)  # the ServingEngine's; not part of AsyncEngine
    memory = backend.memory_summary() if backend is not None else None
    if memory:
        lines.append(f"ruvllm: {memory}")
    return "\n".join(lines)


def check_port_free(host: str, port: int) -> None:
    """Fail with a one-line reason before loading a model onto a port that is taken."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}; pick another --port "
                              "or stop the process using it") from None


def serve(config: Config, *, served_name: str | None = None,
          engine_options: Mapping[str, Any] | None = None, log_level: str = "info",
          max_context: int | None = None) -> None:
    import uvicorn

    srv = config.server
    check_port_free(srv.host, srv.port)
    engine = load_engine(config, engine_options)
    settings = settings_for(config, engine, served_name=served_name, max_context=max_context)
    app = create_app(engine, settings)
    if srv.host not in ("127.0.0.1", "localhost", "::1") and not settings.api_key:
        log.warning("listening on %s without an API key: anyone who can reach this port can use the model",
                    srv.host)
    if log_level in ("info", "debug"):
        print(startup_banner(engine, settings), file=sys.stderr, flush=True)
    uvicorn.run(app, host=srv.host, port=srv.port, log_level=log_level, timeout_graceful_shutdown=5)


def with_server_overrides(config: Config, **overrides: Any) -> Config:
    """``config`` with CLI flags (None = keep the file's value) applied to ``[server]``."""
    values = {k: v for k, v in overrides.items() if v is not None}
    return attrs.evolve(config, server=attrs.evolve(config.server, **values)) if values else config
