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
max_tokens_limit = 4096   # largest max_tokens a request may ask for
max_n = 16                # largest `n` (choices per request)
```
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from ruvllm.errors import ConfigError

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
    max_tokens_limit: int = attrs.field(default=4096, validator=attrs.validators.ge(1))
    max_n: int = attrs.field(default=16, validator=attrs.validators.ge(1))


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
    #: The file the values came from, if any (for messages).
    source: Path | None = None

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
