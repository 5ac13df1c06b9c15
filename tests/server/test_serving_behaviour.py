"""Behaviour under real load: disconnects cancel, concurrent streams all finish, overload is 503,
and /metrics is valid Prometheus text that counts what happened."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import API_KEY, start_server

AUTH = {"Authorization": f"Bearer {API_KEY}"}
#: Labels every ruvllm series carries (what is served, by which backend).
SERIES_LABELS = ("model_name", "model", "backend")


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in SERIES_LABELS))
            out[(s.name, labels)] = s.value
    return out


def test_metrics_parse_and_count(server, client, model_name):
    before = scrape(server.url)
    resp = client.completions.create(model=model_name, prompt="Count: one, two,", max_tokens=5, temperature=0)
    after = scrape(server.url)
    assert after[("ruvllm:generation_tokens_total", ())] - before[("ruvllm:generation_tokens_total", ())] \
        == resp.usage.completion_tokens
    assert after[("ruvllm:prompt_tokens_total", ())] - before[("ruvllm:prompt_tokens_total", ())] \
        == resp.usage.prompt_tokens
    ttft = ("ruvllm:time_to_first_token_seconds_count", ())
    assert after[ttft] == before[ttft] + 1
    for name in ("ruvllm:num_requests_running", "ruvllm:num_requests_waiting", "ruvllm:kv_cache_usage_perc",
                 "ruvllm:e2e_request_latency_seconds_sum", "ruvllm:inter_token_latency_seconds_count",
                 "ruvllm:request_queue_time_seconds_count", "ruvllm:time_per_output_token_seconds_count"):
        assert (name, ()) in after, name
    assert after[("ruvllm:request_success_total", (("finished_reason", "length"),))] >= 1
    series = [s for f in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)
              for s in f.samples if s.name.startswith("ruvllm:")]
    assert series and all(set(SERIES_LABELS) <= set(s.labels) for s in series)
    assert {s.labels["model"] for s in series} == {server.engine.info.name}


def _cancelled(url: str) -> float:
    return scrape(url).get(("ruvllm:request_success_total", (("finished_reason", "cancelled"),)), 0.0)


def test_client_disconnect_cancels_the_request(server, model_name):
    before = _cancelled(server.url)
    body = {"model": model_name, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True,
            "stream": True, "temperature": 0}
    with httpx.Client(timeout=60) as http, http.stream("POST", server.base_url + "/completions",
                                                       json=body, headers=AUTH) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data: {"):
                got += 1
                if got == 3:
                    break
    # The connection is closed mid-stream; the engine must stop the request and free it.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = scrape(server.url)
        if _cancelled(server.url) == before + 1 and m[("ruvllm:num_requests_running", ())] == 0:
            break
        time.sleep(0.2)
    m = scrape(server.url)
    assert _cancelled(server.url) == before + 1
    assert m[("ruvllm:num_requests_running", ())] == 0
    assert m[("ruvllm:kv_cache_usage_perc", ())] == 0.0


def test_concurrent_streams_all_finish_in_full(server, model_name):
    async def one(aclient: openai.AsyncOpenAI, i: int) -> tuple[int, str | None]:
        stream = await aclient.completions.create(
            model=model_name, prompt=f"Story number {i}:", max_tokens=12, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        tokens, finish = 0, None
        async for chunk in stream:
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
            for c in chunk.choices:
                finish = c.finish_reason or finish
        return tokens, finish

    async def run() -> list[tuple[int, str | None]]:
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0) as aclient:
            return await asyncio.gather(*(one(aclient, i) for i in range(4)))

    results = asyncio.run(run())
    assert results == [(12, "length")] * 4  # nobody cut short


@pytest.fixture(scope="module")
def tiny_queue_server():
    running = start_server(engine_options={"max_queue": 1, "max_num_seqs": 1, "max_in_flight": 1})
    yield running
    running.stop()


def test_full_queue_is_503_with_retry_after(tiny_queue_server):
    srv = tiny_queue_server
    # Long enough that the first request is still running when the third arrives.
    body = {"prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as http, \
            http.stream("POST", srv.base_url + "/completions", json=body, headers=AUTH) as first:
        assert first.status_code == 200
        # Running now. The iterator is kept: a discarded one is closed at once, and httpx then
        # closes the connection, which cancels the request.
        first_lines = first.iter_lines()
        next(first_lines)
        with http.stream("POST", srv.base_url + "/completions", json=body, headers=AUTH) as second:
            assert second.status_code == 200  # waits in the queue
            third = http.post(srv.base_url + "/completions", json={**body, "stream": False, "max_tokens": 1},
                              headers=AUTH)
            assert third.status_code == 503
            assert int(third.headers["Retry-After"]) >= 1
            assert third.json()["error"]["type"] == "overloaded"


def test_non_streaming_client_that_gives_up_cancels_too(server, model_name):
    before = _cancelled(server.url)
    # 500 tokens (the session server's max_tokens_limit is 512) take far longer than the timeout.
    body = {"model": model_name, "prompt": "Once upon a time", "max_tokens": 500, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/completions", json=body, headers=AUTH, timeout=1.5)
    deadline = time.monotonic() + 30
    while _cancelled(server.url) < before + 1 and time.monotonic() < deadline:
        time.sleep(0.25)
    assert _cancelled(server.url) == before + 1
