"""Configuration precedence (file < environment < flags), strictness and option parsing."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from ruvllm.config import Config, load_config, merged_options, parse_option
from ruvllm.errors import ConfigError

TOML = """
backend = "llamacpp"
model = "from-file"
cache_dir = "{cache}"

[backends.llamacpp]
n_threads = 2
n_ctx = 1024

[backends.mlx]
dtype = "float16"
"""


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """A working directory without ruvllm.toml and an environment without RUVLLM_* variables."""
    for var in ("RUVLLM_CONFIG", "RUVLLM_BACKEND", "RUVLLM_MODEL", "RUVLLM_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def write(path: Path, cache: Path) -> Path:
    path.write_text(TOML.format(cache=cache))
    return path


def test_defaults_without_file_or_env(isolated, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(isolated / "xdg"))
    cfg = load_config()
    assert (cfg.backend, cfg.model, cfg.source) == ("auto", "default", None)
    assert cfg.cache_dir == isolated / "xdg" / "ruvllm"
    assert cfg.backends == {}


def test_ruvllm_toml_in_the_working_directory_is_read(isolated):
    write(isolated / "ruvllm.toml", isolated / "c")
    cfg = load_config(env={})
    assert cfg.backend == "llamacpp" and cfg.model == "from-file"
    assert cfg.source == Path("ruvllm.toml")
    assert cfg.cache_dir == isolated / "c"
    assert cfg.options_for("llamacpp") == {"n_threads": 2, "n_ctx": 1024}
    assert cfg.options_for("candle_like") == {}


def test_explicit_path_beats_ruvllm_config_and_the_local_file(isolated, tmp_path):
    (isolated / "ruvllm.toml").write_text('model = "local"\n')
    (tmp_path / "env.toml").write_text('model = "via-env"\n')
    (tmp_path / "explicit.toml").write_text('model = "explicit"\n')
    env = {"RUVLLM_CONFIG": str(tmp_path / "env.toml")}
    assert load_config(tmp_path / "explicit.toml", env=env).model == "explicit"
    assert load_config(env=env).model == "via-env"
    assert load_config(env={}).model == "local"


def test_ruvllm_config_from_os_environ(isolated, tmp_path, monkeypatch):
    (tmp_path / "env.toml").write_text('backend = "mlx"\n')
    monkeypatch.setenv("RUVLLM_CONFIG", str(tmp_path / "env.toml"))
    cfg = load_config()
    assert cfg.backend == "mlx" and cfg.source == tmp_path / "env.toml"


def test_precedence_file_then_env_then_overrides(isolated, tmp_path):
    path = write(tmp_path / "c.toml", tmp_path / "file-cache")
    env = {"RUVLLM_MODEL": "from-env", "RUVLLM_CACHE_DIR": str(tmp_path / "env-cache")}
    cfg = load_config(path, env=env, overrides={"cache_dir": tmp_path / "flag-cache", "backend": None})
    assert cfg.backend == "llamacpp"  # file (the None override is ignored)
    assert cfg.model == "from-env"  # env beats file
    assert cfg.cache_dir == tmp_path / "flag-cache"  # flag beats env
    cfg = load_config(path, env=env, overrides={"model": "from-flag"})
    assert cfg.model == "from-flag"


def test_empty_env_values_are_ignored(isolated, tmp_path):
    path = write(tmp_path / "c.toml", tmp_path)
    assert load_config(path, env={"RUVLLM_MODEL": ""}).model == "from-file"


def test_cache_dir_expands_the_home_directory(isolated, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load_config(env={"RUVLLM_CACHE_DIR": "~/models"})
    assert cfg.cache_dir == tmp_path / "models"


def test_unknown_keys_are_named(isolated, tmp_path):
    (tmp_path / "bad.toml").write_text('backend = "auto"\nmodle = "typo"\nthreads = 3\n')
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "bad.toml", env={})
    msg = str(info.value)
    assert "modle" in msg and "threads" in msg and str(tmp_path / "bad.toml") in msg
    assert "known keys" in msg and "backend" in msg


def test_unknown_override_is_a_config_error(isolated):
    with pytest.raises(ConfigError, match="bogus"):
        load_config(env={}, overrides={"bogus": 1})


def test_wrong_types_are_config_errors(isolated, tmp_path):
    (tmp_path / "t.toml").write_text("backend = 3\n")
    with pytest.raises(ConfigError, match="backend must be a string"):
        load_config(tmp_path / "t.toml", env={})
    (tmp_path / "b.toml").write_text('backends = "llamacpp"\n')
    with pytest.raises(ConfigError, match=r"\[backends.NAME\]"):
        load_config(tmp_path / "b.toml", env={})


def test_missing_and_malformed_files(isolated, tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", env={})
    (tmp_path / "broken.toml").write_text("backend = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(tmp_path / "broken.toml", env={})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("n_threads=2", ("n_threads", 2)),
        ("temp=0.5", ("temp", 0.5)),
        ("flash=true", ("flash", True)),
        ("name=hello", ("name", "hello")),
        ('name="quoted value"', ("name", "quoted value")),
        ("path=/tmp/x.gguf", ("path", "/tmp/x.gguf")),
        ("layers=[1, 2]", ("layers", [1, 2])),
        (" key = 3", ("key", 3)),
        ("empty=", ("empty", "")),
        ("day=2024-01-02", ("day", datetime.date(2024, 1, 2))),
    ],
)
def test_parse_option_types_values(text, expected):
    key, value = parse_option(text)
    assert (key, value) == expected
    assert type(value) is type(expected[1])


@pytest.mark.parametrize("bad", ["novalue", "=3", "  =x"])
def test_parse_option_needs_key_equals_value(bad):
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_option(bad)


def test_cli_options_override_the_backend_table(isolated, tmp_path):
    path = write(tmp_path / "c.toml", tmp_path)
    flags = dict([parse_option("n_threads=1"), parse_option("seed=7")])
    cfg = load_config(path, env={}, backend_options=flags)
    assert merged_options(cfg, "llamacpp") == {"n_threads": 1, "n_ctx": 1024, "seed": 7}
    assert merged_options(cfg, "mlx") == {"dtype": "float16", "n_threads": 1, "seed": 7}
    assert merged_options(load_config(path, env={}), "llamacpp") == {"n_threads": 2, "n_ctx": 1024}


def test_config_is_a_frozen_value():
    cfg = Config(cache_dir="/tmp/x")
    assert cfg.cache_dir == Path("/tmp/x")
    with pytest.raises(AttributeError):
        cfg.backend = "mlx"  # type: ignore[misc]


def test_command_line_engine_options_are_merged_once_over_every_engine_table():
    from ruvllm.config import Config, ModelConfig

    cfg = Config(engine={"max_num_seqs": 4, "block_size": 16},
                 models=(ModelConfig(name="a", model="default"),
                         ModelConfig(name="b", model="default", engine={"max_queue": 8})))
    merged = cfg.with_engine({"max_num_seqs": 2})
    assert merged.engine == {"max_num_seqs": 2, "block_size": 16}
    assert merged.models[0].engine is None  # reads the [engine] table, merged above
    assert merged.models[1].engine == {"max_queue": 8, "max_num_seqs": 2}
    assert cfg.with_engine({}) is cfg and cfg.with_engine(None) is cfg
