"""Configuration: a TOML file, then environment variables, then CLI flags (later wins).

```toml
# ruvllm.toml
backend = "auto"          # or llamacpp, candle_like, mlx, mistralrs
model = "default"         # alias, Hugging Face repo, or a local path
cache_dir = "~/.cache/ruvllm"

[backends.llamacpp]       # options passed to that backend only
n_threads = 2

[server]                  # `ruvllm serve` (flags override these)
host = "127.0.0.1"        # loopback unless told otherwise
port = 8000
api_key = ""              # or RUVLLM_API_KEY; empty = no authentication
max_body_bytes = 1048576  # larger request bodies get 413
max_file_bytes = 209715200  # largest batch input (POST /v1/files, /v1/messages/batches), 200 MiB
stored_responses = 1000   # Responses API: the newest kept for previous_response_id and GET (0: none)
stored_conversations = 1000  # Conversations API: the newest kept (0: none)
stored_chat_completions = 1000  # chat completions sent with store: true, the newest kept (0: none)
max_tokens_limit = 4096   # largest max_tokens a request may ask for
max_n = 16                # largest `n` (choices per request)
reasoning_format = "auto" # thinking (<think>...</think>) apart from the answer: auto, deepseek, none
lora_adapters = {}        # LoRA adapters served by name: {name = "/path/to/peft-dir"}
allow_runtime_lora = false  # POST /v1/load_lora_adapter and /v1/unload_lora_adapter
load_wait = 30            # seconds a request waits for its model to load, then 503 + Retry-After
memory_budget = ""        # bytes ("8GB") the loaded models may take; LRU idle ones are unloaded
ui = true                 # the chat page at / and /ui (--no-ui: off)

[[models]]                # several models in one server (instead of the top-level `model`)
name = "small"            # what requests send as `model`
model = "default"         # model reference
backend = "llamacpp"      # default: the top-level backend
options = {n_threads = 2} # that backend's options
engine = {}               # ServingEngine options (default: the [engine] table)
keep_alive = "5m"         # unload after this long idle (seconds or 30s/5m/1h; default: never)
preload = false           # load at start instead of on first use
lora_adapters = {}        # as in [server], for this model
```
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from ruvllm.errors import ConfigError
from ruvllm.reasoning import REASONING_FORMATS

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

DEFAULT_FILE = "ruvllm.toml"
CONFIG_ENV = "RUVLLM_CONFIG"
#: Environment variables for the top-level keys.
ENV_KEYS = {"backend": "RUVLLM_BACKEND", "model": "RUVLLM_MODEL", "cache_dir": "RUVLLM_CACHE_DIR"}


@attrs.frozen(kw_only=True)
class ServerConfig:
    """``[server]``: safe defaults for the OpenAI-compatible server (loopback, bounded requests)."""

    host: str = "127.0.0.1"
    port: int = attrs.field(default=8000, validator=attrs.validators.and_(
        attrs.validators.instance_of(int), attrs.validators.ge(0), attrs.validators.le(65535)))
    api_key: str | None = None
    max_body_bytes: int = attrs.field(default=1 << 20, validator=attrs.validators.ge(1))
    #: The body limit of a batch's input (``POST /v1/files``, ``/v1/messages/batches``): larger than
    #: a request's.
    max_file_bytes: int = attrs.field(default=200 << 20, validator=attrs.validators.ge(1))
    #: Responses the Responses API keeps (for ``previous_response_id``, ``GET``, ``background``),
    #: the newest first; 0 keeps none (the API is then stateless).
    stored_responses: int = attrs.field(default=1000, validator=attrs.validators.ge(0))
    #: Conversations the Conversations API keeps, the newest first; 0 keeps none.
    stored_conversations: int = attrs.field(default=1000, validator=attrs.validators.ge(0))
    #: Chat completions sent with ``store: true`` kept, the newest first; 0 keeps none.
    stored_chat_completions: int = attrs.field(default=1000, validator=attrs.validators.ge(0))
    max_tokens_limit: int = attrs.field(default=4096, validator=attrs.validators.ge(1))
    max_n: int = attrs.field(default=16, validator=attrs.validators.ge(1))
    #: Where thinking goes (ruvllm.reasoning.REASONING_FORMATS): ``auto`` apart from the answer
    #: for models whose chat template writes think tags.
    reasoning_format: str = attrs.field(default="auto", validator=attrs.validators.in_(REASONING_FORMATS))
    #: LoRA adapters of the served model: name -> PEFT directory.
    lora_adapters: Mapping[str, str] = attrs.field(factory=dict, converter=lambda v: _adapters(v, "[server]"))
    allow_runtime_lora: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    load_wait: float = attrs.field(default=30.0, converter=float, validator=attrs.validators.ge(0))
    memory_budget: int | None = attrs.field(default=None, converter=lambda v: parse_bytes(v, "memory_budget"))
    #: The chat page in the browser (``/``, ``/ui``); its files are public, its data needs the key.
    ui: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))


_BYTE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(value: Any, what: str) -> int | None:
    """Bytes from an integer or "512MB" / "8GiB"; None or "" = no limit."""
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        text = value.strip().upper().replace(" ", "")
        number = text.rstrip("KMGTIB")
        unit = text[len(number):]
        try:
            if unit in _BYTE_UNITS and float(number) > 0:
                return int(float(number) * _BYTE_UNITS[unit])
        except ValueError:
            pass
    raise ConfigError(f"{what}: {value!r} is not a size; use bytes (8000000000) or a size like \"8GB\" or "
                      "\"512MiB\"")


def _adapters(value: Any, where: str) -> dict[str, str]:
    """``{name = "path"}`` LoRA adapters, checked for shape (paths are checked when loaded)."""
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in value.items()):
        raise ConfigError(f"{where} lora_adapters must be a table of name = \"path to a PEFT LoRA "
                          f"directory\", got {value!r}")
    return dict(value)


def parse_duration(value: Any, what: str = "keep_alive") -> float | None:
    """Seconds from a number or "30s" / "5m" / "1h"; None or negative = forever (None)."""
    if value is None:
        return None
    seconds = None
    if isinstance(value, str):
        text = value.strip().lower()
        scale = {"s": 1, "m": 60, "h": 3600}.get(text[-1:])
        with contextlib.suppress(ValueError):
            seconds = float(text[:-1]) * scale if scale else float(text)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    if seconds is None:
        raise ConfigError(f"{what}: {value!r} is not a duration; use seconds (30), or 30s, 5m, 1h")
    return None if seconds < 0 else seconds


@attrs.frozen(kw_only=True)
class ModelConfig:
    """One ``[[models]]`` table: a model served under ``name`` next to others."""

    name: str = attrs.field(validator=attrs.validators.and_(attrs.validators.instance_of(str),
                                                            attrs.validators.min_len(1)))
    model: str = attrs.field(validator=attrs.validators.instance_of(str))
    #: None: the top-level ``backend``.
    backend: str | None = attrs.field(default=None,
                                      validator=attrs.validators.optional(attrs.validators.instance_of(str)))
    #: That backend's options (over its ``[backends.<name>]`` table).
    options: Mapping[str, Any] = attrs.field(factory=dict, validator=attrs.validators.instance_of(Mapping))
    #: ServingEngine options; None: the ``[engine]`` table.
    engine: Mapping[str, Any] | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(Mapping)))
    keep_alive: float | None = attrs.field(default=None, converter=parse_duration)
    preload: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    lora_adapters: Mapping[str, str] = attrs.field(factory=dict,
                                                   converter=lambda v: _adapters(v, "[[models]]"))


def _models(value: Any) -> tuple[ModelConfig, ...]:
    if isinstance(value, tuple) and all(isinstance(m, ModelConfig) for m in value):
        return value
    if not isinstance(value, (list, tuple)) or not all(isinstance(m, (Mapping, ModelConfig)) for m in value):
        raise ConfigError("[[models]] must be an array of tables (one [[models]] table per model)")
    out = []
    known = {f.name for f in attrs.fields(ModelConfig)}
    for i, table in enumerate(value):
        if isinstance(table, ModelConfig):
            out.append(table)
            continue
        unknown = set(table) - known
        if unknown:
            raise ConfigError(f"[[models]] #{i + 1}: unknown key(s) {', '.join(sorted(unknown))}; "
                              f"known keys: {', '.join(sorted(known))}")
        missing = {"name", "model"} - set(table)
        if missing:
            raise ConfigError(f"[[models]] #{i + 1}: {' and '.join(sorted(missing))} missing; every model "
                              "needs a name (what requests send) and a model reference")
        try:
            out.append(ModelConfig(**table))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"[[models]] #{i + 1} ({table.get('name')!r}): {exc}") from None
    names = [m.name for m in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"[[models]]: names must be unique, got {names}")
    return tuple(out)


def _server_config(value: Any) -> ServerConfig:
    if isinstance(value, ServerConfig):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError("[server] must be a table of options")
    known = {f.name for f in attrs.fields(ServerConfig)}
    unknown = set(value) - known
    if unknown:
        raise ConfigError(f"[server]: unknown key(s) {', '.join(sorted(unknown))}; "
                          f"known keys: {', '.join(sorted(known))}")
    try:
        return ServerConfig(**{k: (v or None) if k == "api_key" else v for k, v in value.items()})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"[server]: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(f"[server]: {exc}") from None


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ruvllm"


@attrs.frozen(kw_only=True)
class Config:
    backend: str = "auto"
    model: str = "default"
    cache_dir: Path = attrs.field(factory=default_cache_dir, converter=lambda p: Path(p).expanduser())
    #: Per-backend options: ``{"llamacpp": {"n_threads": 2}}``.
    backends: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    #: ServingEngine options (the ``[engine]`` table: max_num_seqs, max_batch_tokens,
    #: block_size, num_blocks, policy, max_queue, request_timeout, enable_prefix_caching...),
    #: validated by ``ruvllm.engine.EngineOptions.from_mapping``.
    engine: Mapping[str, Any] = attrs.field(factory=dict)
    #: ``[sona]`` table: learning from feedback (validated by the SONA plugin; see docs/sona.md).
    sona: Mapping[str, Any] = attrs.field(factory=dict)
    #: ``[server]`` table for ``ruvllm serve``.
    server: ServerConfig = attrs.field(factory=ServerConfig, converter=_server_config)
    #: ``[[models]]`` tables: several models in one ``ruvllm serve`` (empty: serve ``model``).
    models: tuple[ModelConfig, ...] = attrs.field(default=(), converter=_models)
    #: The file the values came from, if any (for messages).
    source: Path | None = None

    def with_engine(self, overrides: Mapping[str, Any] | None) -> Config:
        """This config with engine options given on the command line (``--engine-option``,
        ``--max-concurrent``) over the ``[engine]`` table and over each ``[[models]]`` entry's own
        engine table: the one place they are merged; everything downstream reads ``engine``."""
        if not overrides:
            return self
        models = tuple(m if m.engine is None else attrs.evolve(m, engine={**m.engine, **overrides})
                       for m in self.models)
        return attrs.evolve(self, engine={**self.engine, **overrides}, models=models)

    def options_for(self, backend: str) -> dict[str, Any]:
        return dict(self.backends.get(backend, {}))


_TOP_KEYS = {f.name for f in attrs.fields(Config)} - {"source"}


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown key(s) {', '.join(sorted(unknown))}; "
            f"known keys: {', '.join(sorted(_TOP_KEYS))}"
        )
    backends = data.get("backends", {})
    if not isinstance(backends, dict) or not all(isinstance(v, dict) for v in backends.values()):
        raise ConfigError(f"config file {path}: [backends.NAME] must be tables of options")
    if not isinstance(data.get("engine", {}), dict):
        raise ConfigError(f"config file {path}: [engine] must be a table of engine options")
    if not isinstance(data.get("sona", {}), dict):
        raise ConfigError(f"config file {path}: [sona] must be a table of SONA options")
    return data


def parse_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` from the command line; VALUE is read as TOML when it parses, else a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"option {text!r} must look like KEY=VALUE")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip(), value


def load_config(
    path: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    backend_options: Mapping[str, Any] | None = None,
) -> Config:
    """Merge file < environment < ``overrides`` (CLI flags; None values are ignored).

    ``backend_options`` (CLI ``--option``) apply to the backend finally selected by name; with
    ``auto`` they apply to whichever backend auto picks.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    source: Path | None = None
    if path is None and env.get(CONFIG_ENV):
        path = env[CONFIG_ENV]
    if path is not None:
        source = Path(path).expanduser()
    elif Path(DEFAULT_FILE).is_file():
        source = Path(DEFAULT_FILE)
    if source is not None:
        values.update(_read_file(source))
    for key, var in ENV_KEYS.items():
        if env.get(var):
            values[key] = env[var]
    for key, value in (overrides or {}).items():
        if key not in _TOP_KEYS:
            raise ConfigError(
                f"unknown setting {key!r}; known settings: {', '.join(sorted(_TOP_KEYS))}"
            )
        if value is not None:
            values[key] = value
    for key in ("backend", "model"):
        if key in values and not isinstance(values[key], str):
            where = f"config file {source}" if source is not None else "configuration"
            raise ConfigError(f"{where}: {key} must be a string, got {values[key]!r}")
    backends = {k: dict(v) for k, v in values.pop("backends", {}).items()}
    if backend_options:
        backends["*"] = dict(backend_options)
    return Config(**values, backends=backends, source=source)


def merged_options(config: Config, backend: str) -> dict[str, Any]:
    """Options for ``backend``: its table, then the CLI's ``--option`` values."""
    return {**config.options_for(backend), **config.options_for("*")}
