"""Feedback through ``RemoteEngine`` reaches SONA in the replica that served the request, with the
request's tenant: one replica running candle_like with ``[sona] enabled`` (SONA trains through
candle_like), in Serve's local testing mode (the replica class in this process, called through
a DeploymentHandle). Where the call goes among several replicas, and that the app's route awaits
the delivery, is checked on a real cluster (test_multi_node.py, without SONA)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray.serve")
pytest.importorskip("ruvllm_sona")


def test_feedback_through_the_remote_engine_is_recorded_by_sona_with_its_tenant():
    from ray import serve
    from ruvllm.config import load_config
    from ruvllm.engine.options import EngineOptions
    from ruvllm.errors import FeedbackNotFound
    from ruvllm.scaleout.remote_engine import RemoteEngine
    from ruvllm.scaleout.replica import EngineReplica
    from ruvllm.types import GenerationParams
    from ruvllm_sona import plugin

    # No background training during the test: it needs 1,000 scores first.
    config = load_config(overrides={"backend": "candle_like", "model": "default",
                                    "sona": {"enabled": True, "min_feedback": 1000}})
    handle = serve.run(serve.deployment(EngineReplica).bind(config, None), _local_testing_mode=True)

    async def run() -> list:
        # No tokenizer: the prompt is given as ids (a second candle_like load would double the time).
        engine = RemoteEngine(handle, await handle.describe.remote(), None, options=EngineOptions(),
                              tenant_affinity=True)
        try:
            done = await engine.submit([1, 504, 2462, 28], GenerationParams(max_tokens=4, tenant="alice"),
                                       request_id="chatcmpl-x-0")
            await done.result()
            await engine.feedback("chatcmpl-x-0", 0.5)
            with pytest.raises(FeedbackNotFound):
                engine.feedback("chatcmpl-never-0", 1.0)
            (sona,) = plugin._attached.values()  # the replica's engine's SONA, in this process
            return sona.store.snapshot()
        finally:
            await engine.shutdown()

    try:
        records = asyncio.run(run())
    finally:
        for served in list(plugin._attached):  # the replica's engine: stop SONA's thread, then it
            plugin.detach(served)
            served.close()
        serve.shutdown()
    (record,) = records
    assert (record.trajectory.request_id, record.trajectory.tenant, record.feedback) == \
        ("chatcmpl-x-0", "alice", 0.5)
