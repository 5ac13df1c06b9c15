"""Load the engine, build the app and run uvicorn: what ``ruvllm serve`` does.

The model is loaded *before* the socket is bound, so a model that cannot load makes the command
fail with the reason; nothing is ever served in its place. With ``[[models]]`` (or several
``--model``) the models go into a :class:`~ruvllm.server.lifecycle.model_pool.ModelPool` instead and load on
first use, or at start with ``preload``; a preloaded model that fails stops the server's start.
"""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from fastapi import FastAPI

from ruvllm.config import Config, ModelConfig
from ruvllm.errors import ConfigError
from ruvllm.server.app import ServerSettings, create_app
from ruvllm.server.lifecycle.model_pool import ModelPool, ModelSpec
from ruvllm.server.lifecycle.params import Limits
from ruvllm.server.ui.page import page_url
from ruvllm.serving import AsyncEngine

log = logging.getLogger(__name__)


def load_engine(config: Config) -> AsyncEngine:
    """The batching ServingEngine on the configured backend and model (loaded now), with the
    config's engine options (``Config.with_engine`` put the command line's there)."""
    from ruvllm.engine import ServingEngine

    return ServingEngine.from_config(config)


def settings_for(config: Config, engine: AsyncEngine | None, *, served_name: str | None = None,
                 max_context: int | None = None) -> ServerSettings:
    name = served_name or (engine.info.name if engine is not None else config.model)
    aliases = tuple({config.model, engine.info.name if engine is not None else name} - {name})
    srv = config.server
    from ruvllm.engine import EngineOptions

    return ServerSettings(model_name=name, aliases=aliases, api_key=srv.api_key or None,
                          max_body_bytes=srv.max_body_bytes, max_file_bytes=srv.max_file_bytes,
                          max_num_seqs=EngineOptions.from_mapping(config.engine).max_num_seqs,
                          stored_responses=srv.stored_responses,
                          stored_conversations=srv.stored_conversations,
                          stored_chat_completions=srv.stored_chat_completions,
                          limits=Limits(max_tokens=srv.max_tokens_limit, max_n=srv.max_n,
                                        max_context=max_context, reasoning_format=srv.reasoning_format),
                          lora_adapters=dict(srv.lora_adapters), allow_runtime_lora=srv.allow_runtime_lora,
                          ui=srv.ui)


def _model_bytes(config: Config, ref: str) -> int:
    """The size of ``ref``'s weights on disk: what ``memory_budget`` counts a model as."""
    from ruvllm.registry import resolve

    path = Path(resolve(ref, config.cache_dir).path)
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def model_spec(config: Config, model: ModelConfig, *,
               extra_adapters: Mapping[str, str] | None = None) -> ModelSpec:
    """The pool entry of one ``[[models]]`` table: a ServingEngine on its backend, options and model."""
    backends = {**config.backends, "*": {**config.options_for("*"), **model.options}}
    cfg = attrs.evolve(config, model=model.model, backend=model.backend or config.backend, backends=backends,
                       engine=config.engine if model.engine is None else model.engine, models=())
    return ModelSpec(name=model.name, loader=lambda: load_engine(cfg), keep_alive=model.keep_alive,
                     preload=model.preload, memory_estimate=lambda: _model_bytes(config, model.model),
                     adapters={**(extra_adapters or {}), **model.lora_adapters}, reference=model.model)


def build_pool(config: Config) -> ModelPool:
    """The pool of ``config.models``; ``[server] lora_adapters`` (``--lora``) go to the first model."""
    srv = config.server
    specs = [model_spec(config, m, extra_adapters=srv.lora_adapters if i == 0 else None)
             for i, m in enumerate(config.models)]
    return ModelPool(specs, load_wait=srv.load_wait, memory_budget=srv.memory_budget)


def pool_settings(config: Config, pool: ModelPool, *, max_context: int | None = None) -> ServerSettings:
    """The settings of a pool's server: ``[server]``'s, without the single engine's names and
    adapters (the pool holds each model's)."""
    single = settings_for(config, None, served_name=pool.default.name, max_context=max_context)
    return attrs.evolve(single, aliases=(), lora_adapters={})


def pool_banner(pool: ModelPool) -> str:
    """What ``ruvllm serve`` prints for several models: each one's reference and when it loads."""
    lines = [f"ruvllm: serving {len(pool.entries)} models; each loads on first use unless preloaded"]
    for entry in pool.entries.values():
        spec = entry.spec
        keep = "never unloaded" if spec.keep_alive is None else f"unloaded after {spec.keep_alive:g} s idle"
        lines.append(f"ruvllm:   {spec.name}: {spec.reference} ({'preloaded' if spec.preload else 'lazy'}, "
                     f"{keep})")
    return "\n".join(lines)


def startup_banner(engine: AsyncEngine, settings: ServerSettings) -> str:
    """What ``ruvllm serve`` prints before it listens: the model and backend, how many tokens one
    request may use, and the memory the backend sized from a setting (its KV cache), so that a
    window smaller than the model's or a large allocation is never a surprise."""
    room = settings.limits.context_length(engine.info.context_length)
    lines = [f"ruvllm: serving {settings.model_name} with backend {engine.backend_name} "
             f"({engine.path} path); prompt + max_tokens of one request: up to {room} tokens"]
    if engine.backend_choice:
        lines.append(f"ruvllm: backend {engine.backend_choice}")
    memory = engine.memory_summary()
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


def check_lora_paths(config: Config) -> None:
    """Fail with the adapter's name before loading a model whose ``--lora`` path does not exist."""
    srv = config.server
    for spec_adapters in (srv.lora_adapters, *(m.lora_adapters for m in config.models)):
        for name, path in spec_adapters.items():
            if not Path(path).expanduser().exists():
                raise ConfigError(f"LoRA adapter {name!r}: {path} does not exist; give the path of a PEFT "
                                  "LoRA directory (--lora NAME=PATH)")


def build_app(config: Config, *, served_name: str | None = None,
              max_context: int | None = None) -> tuple[FastAPI, ServerSettings, str]:
    """The app ``config`` describes (its model loaded now, or its ``[[models]]`` pool), its settings
    and the banner that says what it serves: what ``serve`` listens with and ``run-batch`` runs
    lines through."""
    check_lora_paths(config)
    if config.models:
        pool = build_pool(config)
        settings = pool_settings(config, pool, max_context=max_context)
        return create_app(pool, settings), settings, pool_banner(pool)
    engine = load_engine(config)
    settings = settings_for(config, engine, served_name=served_name, max_context=max_context)
    # A client's keep_alive (Ollama's API) may unload it; the next request loads it again.
    settings = attrs.evolve(settings, reload=lambda: load_engine(config))
    return create_app(engine, settings), settings, startup_banner(engine, settings)


def serve(config: Config, *, served_name: str | None = None, log_level: str = "info",
          max_context: int | None = None) -> None:
    import uvicorn

    srv = config.server
    check_port_free(srv.host, srv.port)
    app, settings, banner = build_app(config, served_name=served_name, max_context=max_context)
    announce(config, settings, banner, log_level)
    uvicorn.Server(uvicorn_config(app, config, log_level)).run()


def announce(config: Config, settings: ServerSettings, banner: str, log_level: str) -> None:
    """Warn about an exposed server without a key, then print the banner and the chat page's
    address: what both ``ruvllm serve`` and ``ruvllm serve --ray`` say before they listen."""
    srv = config.server
    if srv.host not in ("127.0.0.1", "localhost", "::1") and not settings.api_key:
        log.warning("listening on %s without an API key: anyone who can reach this port can use the model",
                    srv.host)
    if settings.allow_runtime_lora and not settings.api_key:
        log.warning("runtime LoRA loading is on without an API key: any client can make this server read "
                    "adapter files from its disk; set --api-key")
    if log_level in ("info", "debug"):
        print(banner, file=sys.stderr, flush=True)
        if settings.ui:
            print(f"ruvllm: chat page: {page_url(srv.host, srv.port)}", file=sys.stderr, flush=True)


def uvicorn_config(app: FastAPI, config: Config, log_level: str) -> Any:
    """uvicorn's settings for ``app`` on ``[server] host/port``: streams still open get 5 s to
    finish at shutdown."""
    import uvicorn

    srv = config.server
    return uvicorn.Config(app, host=srv.host, port=srv.port, log_level=log_level, timeout_graceful_shutdown=5)


def with_lora_flags(config: Config, lora: tuple[str, ...], allow_runtime: bool | None) -> Config:
    """``--lora NAME=PATH`` (added to ``[server] lora_adapters``) and ``--allow-runtime-lora``."""
    adapters = dict(config.server.lora_adapters)
    for item in lora:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ConfigError(f"--lora {item!r} must look like NAME=PATH (the PEFT LoRA directory)")
        adapters[name.strip()] = path.strip()
    return with_server_overrides(config, lora_adapters=adapters if lora else None,
                                 allow_runtime_lora=allow_runtime)


def with_cli_models(config: Config, model: str | None, models: tuple[str, ...]) -> Config:
    """``--model [NAME=]MODEL`` repeated: the models (with ``MODEL``, the positional argument,
    first) replace ``[[models]]``, each preloaded. One model alone is plain single-model serving."""
    refs = ([model] if model else []) + list(models)
    if not models:
        return config
    if len(refs) == 1 and "=" not in refs[0]:
        return attrs.evolve(config, model=refs[0], models=())
    tables = []
    for ref in refs:
        name, sep, target = ref.partition("=")
        if sep and (not name.strip() or not target.strip()):
            raise ConfigError(f"--model {ref!r} must look like MODEL or NAME=MODEL")
        tables.append(ModelConfig(name=name.strip() if sep else ref, model=target.strip() if sep else ref,
                                  preload=True))
    return attrs.evolve(config, models=tables)


def with_server_overrides(config: Config, **overrides: Any) -> Config:
    """``config`` with CLI flags (None = keep the file's value) applied to ``[server]``."""
    values = {k: v for k, v in overrides.items() if v is not None}
    return attrs.evolve(config, server=attrs.evolve(config.server, **values)) if values else config
