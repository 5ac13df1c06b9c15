"""lm-evaluation-harness's ``local-completions`` model scores a local loglikelihood task against the
real server, with no network, and its scores equal the backend's own logits computed in-process.

lm-eval finds ``/tokenizer_info`` and ``/tokenize`` (its remote tokenizer), sends token-id prompts
with ``echo: true, logprobs: 1, max_tokens: 1`` and sums ``token_logprobs[ctxlen:-1]``. The
reference forces each continuation token in-process with ``logit_bias`` and reads the logprob the
sampler reports (the model's own, unbiased): a decode-path computation, independent of the prefill
rows the server answers from, hence a tolerance rather than equality.
"""

from __future__ import annotations

import json

import pytest
from ruvllm.types import GenerationParams
from server_helpers import API_KEY

DOCS = [
    {"question": "The capital of France is", "choices": [" Paris", " Berlin", " a banana"], "answer": 0},
    {"question": "One, two, three,", "choices": [" four", " seven"], "answer": 0},
]

TASK = """task: ruvllm_tiny_loglikelihood
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
"""


def _reference(engine, context: str, continuation: str) -> tuple[float, bool]:
    """Loglikelihood of ``continuation`` after ``context`` and whether it is greedy, token by
    token from the engine, split into tokens as lm-eval splits them."""
    whole = engine.encode(context + continuation, add_special=False)
    ctx = engine.encode(context, add_special=False)
    total, greedy = 0.0, True
    for p in range(len(ctx), len(whole)):
        handle = engine.submit_sync(whole[:p], GenerationParams(
            max_tokens=1, logprobs=1, logit_bias={whole[p]: 100}))
        out = next(iter(handle))  # the forced token, with the model's own top alternative
        handle.result()
        assert out.token_id == whole[p]
        total += out.logprob
        greedy = greedy and out.top_logprobs[0].token_id == whole[p]
    return total, greedy


def test_local_completions_loglikelihood_matches_in_process(server, model_name, tmp_path, monkeypatch):
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (tmp_path / "task.yaml").write_text(TASK.format(data=data))
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={"model": model_name, "base_url": server.url + "/v1/completions",
                    "auth_token": API_KEY, "num_concurrent": 1, "max_retries": 1,
                    "tokenized_requests": True},
        tasks=["ruvllm_tiny_loglikelihood"], task_manager=TaskManager(include_path=str(tmp_path)),
        log_samples=True, batch_size=1,
    )
    samples = results["samples"]["ruvllm_tiny_loglikelihood"]
    assert len(samples) == len(DOCS)
    checked = 0
    for sample in samples:
        for (context, continuation), resp in zip(sample["arguments"], sample["resps"], strict=True):
            got_ll, got_greedy = resp[0]
            ref_ll, ref_greedy = _reference(server.engine, context, continuation)
            assert got_ll == pytest.approx(ref_ll, abs=5e-3), (context, continuation)
            assert bool(got_greedy) == ref_greedy, (context, continuation)
            checked += 1
    assert checked == sum(len(d["choices"]) for d in DOCS)
    acc = results["results"]["ruvllm_tiny_loglikelihood"]["acc,none"]
    assert 0.0 <= acc <= 1.0
