"""``backend = "auto"`` ranked by what ``ruvllm tune`` measured on this machine."""

from __future__ import annotations

import json
import logging

import attrs
import pytest
from click.testing import CliRunner
from ruvllm.auto_backend import (
    AutoRecord,
    Measurement,
    load_record,
    machine_key,
    record_path,
    save_record,
)
from ruvllm.cli import main
from ruvllm.config import Config
from ruvllm.engine import ServingEngine
from ruvllm.models import ModelSource
from ruvllm.plugins import get_registry
from ruvllm.registry import embedded_model_path
from ruvllm.server.runner import settings_for, startup_banner

#: Figures shaped like the AVX-512 + bf16 machine's (issue 22): llama.cpp leads for one client,
#: candle_like for sixteen.
CROSSING = [Measurement("llamacpp", 1, 100.0), Measurement("candle_like", 1, 45.0),
            Measurement("llamacpp", 16, 140.0), Measurement("candle_like", 16, 280.0)]


@pytest.fixture
def model() -> ModelSource:
    return ModelSource.from_path(embedded_model_path())


def record() -> AutoRecord:
    return AutoRecord(machine=machine_key(), model="m", measured_at="now", measurements=CROSSING)


@pytest.mark.parametrize(("load", "first", "clients"), [(1, "llamacpp", 1), (2, "llamacpp", 1),
                                                        (8, "candle_like", 16), (64, "candle_like", 16)])
def test_ranking_follows_the_measured_load_nearest_on_a_log_scale(load, first, clients) -> None:
    ranked, at = record().ranking(load)
    assert (ranked[0], at) == (first, clients)
    assert set(ranked) == {"llamacpp", "candle_like"}


def test_unmeasured_backends_follow_in_the_fixed_order() -> None:
    pref = record().preference(16, ["llamacpp", "mlx", "candle_like", "mistralrs"])
    assert pref.order == ("candle_like", "llamacpp", "mlx", "mistralrs")
    assert "candle_like 280.0 tok/s, llamacpp 140.0 tok/s" in pref.why


def test_a_record_round_trips_and_is_ignored_for_another_machine(tmp_path, model, caplog) -> None:
    saved = save_record(tmp_path, model, CROSSING)
    assert load_record(tmp_path, model) == saved
    path = record_path(tmp_path, model)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "machine": "x86_64 | another CPU | avx2 | 64 cores"}))
    with caplog.at_level(logging.INFO, logger="ruvllm.auto_backend"):
        assert load_record(tmp_path, model) is None
    assert "measured on another machine" in caplog.text
    path.write_text("{not json")
    assert load_record(tmp_path, model) is None
    assert "run `ruvllm tune` again" in caplog.text


def test_auto_picks_the_measured_fastest_for_its_load(tmp_path, model, caplog) -> None:
    registry = get_registry()
    if not {"llamacpp", "candle_like"} <= set(registry.backends):
        pytest.skip("needs the llamacpp and candle_like backends installed")
    # A measured backend that is not installed here is passed over, with the reason logged.
    save_record(tmp_path, model, [Measurement("not-installed", 16, 999.0), *CROSSING])
    with caplog.at_level(logging.INFO, logger="ruvllm.plugins"):
        assert registry.select("auto", model, load=16, cache_dir=tmp_path).name == "candle_like"
    assert "measured by `ruvllm tune`" in caplog.text and "not-installed: not installed" in caplog.text
    assert registry.select("auto", model, load=1, cache_dir=tmp_path).name == "llamacpp"
    # No record: the fixed order, with a backend that claims the model first (candle_like on the
    # kind it was measured on, tests/candle_like/test_auto_claim.py); the log says nothing was
    # measured here.
    caplog.clear()
    claimed = registry.backends["candle_like"].fastest_here(model)
    with caplog.at_level(logging.INFO, logger="ruvllm.plugins"):
        picked = registry.select("auto", model, load=16, cache_dir=tmp_path / "empty").name
    assert picked == ("candle_like" if claimed else "llamacpp")
    assert "not measured on this machine" in caplog.text


def test_tune_measures_and_records_what_auto_reads(tmp_path, model) -> None:
    if "llamacpp" not in get_registry().backends:
        pytest.skip("the llamacpp backend is not installed")
    res = CliRunner().invoke(main, ["--cache-dir", str(tmp_path), "tune", "--backends", "llamacpp",
                                    "--concurrency", "1,2", "--prompt-length", "8", "--gen-length", "2"])
    assert res.exit_code == 0, res.output
    assert "auto now picks llamacpp for ruvllm serve (max_num_seqs 16)" in res.output
    saved = load_record(tmp_path, model)
    assert saved is not None and saved.machine == machine_key()
    assert sorted(m.clients for m in saved.measurements) == [1, 2]
    assert all(m.backend == "llamacpp" and m.output_tok_s > 0 for m in saved.measurements)


def test_tune_refuses_a_backend_that_cannot_run(tmp_path) -> None:
    res = CliRunner().invoke(main, ["--cache-dir", str(tmp_path), "tune", "--backends", "no-such-backend"])
    assert res.exit_code != 0
    assert "no-such-backend" in res.output
    assert not (tmp_path / "auto-backend").exists()


def test_serve_says_why_auto_picked_its_backend(tmp_path, model) -> None:
    """The engine ``auto`` builds keeps what decided its backend, for the load it is sized for
    (tune's figures, or the fixed order), and the start-up banner shows it (``/health`` reads the
    same attribute); a named backend needs no reason."""
    registry = get_registry()
    if not {"llamacpp", "candle_like"} <= set(registry.backends):
        pytest.skip("needs the llamacpp and candle_like backends installed")
    save_record(tmp_path, model, CROSSING)
    config = Config(cache_dir=tmp_path)

    def choice(cfg: Config) -> str | None:
        with ServingEngine.from_config(cfg) as engine:
            banner = startup_banner(engine, settings_for(cfg, engine))
            said = f"ruvllm: backend {engine.backend_choice}" in banner
            assert said == (engine.backend_choice is not None), banner
            return engine.backend_choice

    assert choice(config).startswith("auto -> candle_like: measured by `ruvllm tune`")
    one = choice(attrs.evolve(config, engine={"max_num_seqs": 1}))
    assert one.startswith("auto -> llamacpp: measured") and "llamacpp 100.0 tok/s" in one
    unmeasured = choice(Config(cache_dir=tmp_path / "empty", engine={"max_num_seqs": 1}))
    assert unmeasured.startswith("auto -> ") and "not measured on this machine" in unmeasured
    assert choice(attrs.evolve(config, backend="llamacpp", engine={"max_num_seqs": 1})) is None
