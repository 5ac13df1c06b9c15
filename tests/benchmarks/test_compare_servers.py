"""benchmarks/compare_servers.py's own logic: prompts no prefix cache can reuse, each request a
prompt of its own (warm-up included), and issue 59's table."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from ruvllm.bench.prompts import fresh_prompts
from ruvllm.bench.serving import EachPromptOnce, sweep

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from compare_servers import load_table, prompts_per_sweep


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("ruvllm_llamacpp", reason="the embedded model's tokenizer comes from llama.cpp")
    from ruvllm.llm import LLM

    with LLM(backend="llamacpp") as llm:
        yield llm.tokenizer


def test_fresh_prompts_share_no_first_token(tokenizer):
    # More prompts than the benchmark text has tokens (~100): windows alone would repeat.
    lengths = [32] * 120 + [550] * 8
    prompts = fresh_prompts(tokenizer, lengths)
    ids = [tokenizer.encode(p) for p in prompts]
    assert len({i[0] for i in ids}) == len(lengths)
    assert all(abs(len(i) - n) <= 1 for i, n in zip(ids, lengths, strict=True))


class Recorder:
    """A target over ``prompts`` prompts that streams one token and notes which it was asked for."""

    name = "recorder"

    def __init__(self, prompts: int):
        self.prompts = range(prompts)
        self.asked: list[int] = []

    async def stream(self, index, max_tokens, record):
        self.asked.append(index)
        record.output_tokens = 1
        yield 1


def test_every_request_of_a_sweep_has_a_prompt_of_its_own():
    levels, min_requests = [1, 2], 3
    count = prompts_per_sweep(levels, min_requests)
    inner = Recorder(count)
    shown: list[dict] = []
    results = asyncio.run(sweep(EachPromptOnce(inner), levels, max_tokens=1, prompt_length=8, warmup=2,
                                num_requests=lambda c: max(min_requests, 2 * c), measured=shown.append))
    assert sorted(inner.asked) == list(range(count))  # the warm-up's 0 and 1 never again
    assert [r["failed"] for r in results] == [0, 0]
    assert shown == results  # each level shown as it was measured, the warm-up not
    # One more request than prompts fails instead of resending one.
    once = EachPromptOnce(Recorder(1))
    again = asyncio.run(sweep(once, [2], num_requests=lambda c: 2, max_tokens=1, prompt_length=8, warmup=0))
    assert again[0]["failed"] == 1


def run(target: str, length: int, clients: int, tok_s: float, ttft: float | None, *, answered: int = 4,
        repeat: int | None = None, cut: int = 0) -> dict:
    r = {"target": target, "prompt_length": length, "concurrency": clients, "output_tok_s": tok_s,
         "ttft_s": {"p50": ttft}, "completed": answered, "num_requests": 4, "cut_short": cut}
    return r if repeat is None else {**r, "repeat": repeat}


OURS, PEER = "ruvllm serve (llamacpp)", "llama-server (-np 4)"


def test_load_table_has_the_issues_shape():
    results = [run(OURS, 550, 4, 10.0, 12.5), run(OURS, 64, 4, 90.0, 0.5, cut=1),
               run(OURS, 64, 1, 60.0, 0.095), run(PEER, 64, 1, 80.0, 0.02), run(PEER, 64, 4, 100.0, 0.41),
               run(PEER, 550, 4, 0.0, None, answered=0)]
    lines = load_table(results).splitlines()
    assert lines[0] == f"| load | {PEER} | {OURS} |"
    assert lines[2:] == [
        "| C=1, 64-token prompts | 80.0 (0.020 s) | 60.0, 0.75x (0.095 s) |",
        "| C=4, 64-token prompts | 100.0 (0.41 s) | 90.0, 0.90x (0.50 s), 1 cut short |",
        "| C=4, 550-token prompts | **0 of 4 answered** | 10.0 (12.5 s) |",
    ]


def test_load_table_takes_medians_over_repeats():
    results = [run(OURS, 64, 1, tok, 0.1, repeat=i) for i, tok in enumerate((50.0, 70.0, 90.0))]
    results += [run(PEER, 64, 1, tok, 0.2, repeat=i) for i, tok in enumerate((100.0, 50.0, 100.0))]
    # ratios per repeat 0.5, 1.4, 0.9: their median, not the ratio of the medians (70 / 100)
    row = load_table(results).splitlines()[2]
    assert row == "| C=1, 64-token prompts | 100.0 (0.20 s) | 70.0, 0.90x (0.10 s) |"
