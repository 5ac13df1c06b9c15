"""The serving benchmark's HTTP client measuring the running server, as it would measure a peer."""

from __future__ import annotations

import asyncio

from ruvllm.bench.serving import HttpTarget, ServingConfig, run_serving
from server_helpers import API_KEY


def test_http_target_measures_full_streams(server):
    prompts = ["Once upon a time", "The weather today"]
    cfg = ServingConfig(concurrency=2, num_requests=2, max_tokens=6)

    async def go():
        async with HttpTarget(server.url, prompts, api_key=API_KEY, extra_body={"ignore_eos": True}) as t:
            return await run_serving(t, cfg)

    r = asyncio.run(go())
    assert r["completed"] == 2 and r["failed"] == 0 and r["cut_short"] == 0
    assert r["output_tokens"] == 12  # from the server's usage chunk: real token counts
    assert 0 < r["ttft_s"]["p50"] <= r["e2e_s"]["p50"]


def test_http_target_records_refusals(server):
    cfg = ServingConfig(concurrency=1, num_requests=1, max_tokens=4)

    async def go():
        async with HttpTarget(server.url, ["hi"], api_key="wrong", model="x") as t:
            return await run_serving(t, cfg)

    r = asyncio.run(go())
    assert r["failed"] == 1 and "HTTP 401" in r["errors"][0]
