"""``ruvllm benchmark`` on the embedded model: tiny runs, every output format, and the statistics."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest
from click.testing import CliRunner
from ruvllm.bench.serving import RequestRecord, ServingConfig, aggregate
from ruvllm.bench.stats import percentile
from ruvllm.cli import main
from ruvllm.plugins import get_registry


@pytest.fixture(autouse=True)
def _llamacpp():
    if "llamacpp" not in get_registry().backends:
        pytest.skip("the llamacpp backend is not installed")


def test_percentiles_interpolate():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 99) == 5
    assert math.isnan(percentile([], 50))
    assert percentile(list(range(101)), 95) == 95


def test_aggregate_counts_cut_short_and_latencies():
    cfg = ServingConfig(concurrency=2, num_requests=3, max_tokens=4)
    full = RequestRecord(start=0.0, arrivals=[0.5, 0.6, 0.7, 0.8], output_tokens=4, finish_reason="length",
                         end=0.8)
    cut = RequestRecord(start=0.0, arrivals=[1.0, 1.1], output_tokens=2, finish_reason="length", end=1.1)
    failed = RequestRecord(start=0.0, error="RuntimeError: HTTP 503", end=0.1)
    r = aggregate("t", cfg, [full, cut, failed], duration=2.0)
    assert (r["completed"], r["failed"], r["cut_short"]) == (2, 1, 1)
    assert r["output_tok_s"] == 3.0
    assert r["ttft_s"]["p50"] == pytest.approx(0.75)
    assert r["itl_s"]["max"] == pytest.approx(0.1)
    assert r["tpot_s"]["p50"] == pytest.approx(0.1)


def test_single_stream_json_and_csv(tmp_path):
    args = ["benchmark", "--backend", "llamacpp", "--warmup", "0", "--iterations", "2",
            "--prompt-length", "16", "--gen-length", "4"]
    res = CliRunner().invoke(main, [*args, "--format", "json", "--output-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    single = report["single"]
    assert single["backend"] == "llamacpp" and len(single["runs"]) == 2
    for run in single["runs"]:
        assert run["prompt_tokens"] == 16 and run["output_tokens"] == 4
        assert 0 < run["ttft_s"] <= run["e2e_s"]
        assert run["decode_tok_s"] > 0 and run["prefill_tok_s"] > 0
    assert single["peak_rss_mb"] > 50
    assert report["machine"]["versions"]["ruvllm"] and report["machine"]["logical_cpus"] >= 1
    rows = list(csv.reader(io.StringIO((tmp_path / "benchmark.csv").read_text())))
    assert rows[0][0] == "backend" and len(rows) == 3


def test_serving_sweep_in_process_writes_plot(tmp_path):
    args = ["benchmark", "--backend", "llamacpp", "--mode", "serving", "--concurrency", "1,2",
            "--num-requests", "2", "--prompt-length", "16", "--gen-length", "4",
            "--output-dir", str(tmp_path)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "out tok/s" in res.stdout
    report = json.loads((tmp_path / "benchmark.json").read_text())
    levels = report["serving"]
    assert [r["concurrency"] for r in levels] == [1, 2]
    for r in levels:
        assert r["completed"] == 2 and r["cut_short"] == 0 and r["failed"] == 0
        assert r["output_tokens"] == 8 and r["output_tok_s"] > 0
        assert r["ttft_s"]["p50"] > 0
    png = (tmp_path / "benchmark.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_bad_flags_are_one_line_errors():
    res = CliRunner().invoke(main, ["benchmark", "--concurrency", "1,x"])
    assert res.exit_code == 1 and res.output.startswith("error: concurrency")
    res = CliRunner().invoke(main, ["benchmark", "--url", "http://127.0.0.1:9"])
    assert res.exit_code == 1 and "--mode serving" in res.output
