"""Scale-out routing and the proxy engine without a Ray cluster.

The affinity policy and the wire format are pure; the proxy engine (RemoteEngine) runs over a
real ServingEngine replica on the embedded model in Ray Serve's local testing mode (in-process
handles, no Ray instance), which exercises the same submit/stream/cancel/error path as a cluster.
"""

from __future__ import annotations

import asyncio
import pickle
import time

import attrs
import pytest
from ruvllm.errors import BackendError, ConfigError, ContextLengthExceeded, InvalidRequest, Overloaded
from ruvllm.scaleout.metrics_board import MetricsBoard, ReplicaMetrics, combine, current
from ruvllm.scaleout.prefix_router import AffinityPolicy, prefix_key
from ruvllm.scaleout.wire import pack_error, unpack_error
from ruvllm.serving import Histogram, MetricsSnapshot, PluginMetric

BS = 16


def test_prefix_key_hashes_the_first_full_blocks():
    shared = list(range(100, 100 + 4 * BS))
    a = prefix_key([*shared, 1, 2, 3], block_size=BS, blocks=4)
    b = prefix_key([*shared, 7, 8, 9, 10, 11], block_size=BS, blocks=4)
    assert a is not None and a == b
    other = prefix_key([5, *shared[1:], 1, 2, 3], block_size=BS, blocks=4)
    assert other != a  # the first block differs
    assert prefix_key(shared[: 4 * BS - 1], block_size=BS, blocks=4) is None  # shorter than the key
    assert prefix_key(shared, block_size=BS, blocks=4, cache_salt="tenant-a") != a
    # Prompts that share their first 2 blocks and differ after them share a 2-block key.
    assert prefix_key([*shared[: 2 * BS], 1, 2], block_size=BS, blocks=2) == \
        prefix_key([*shared[: 2 * BS], 7, 8, 9], block_size=BS, blocks=2)


def test_policy_sends_a_key_home_and_spreads_keys():
    policy = AffinityPolicy(busy_threshold=4)
    loads = {"r0": 0, "r1": 0, "r2": 0}
    homes = {policy.rank(f"key-{i}", loads)[0][0] for i in range(60)}
    assert homes == {"r0", "r1", "r2"}  # keys spread over every replica
    for i in range(20):
        key = f"key-{i}"
        first = policy.rank(key, loads)
        assert first == policy.rank(key, dict(reversed(loads.items())))  # order-independent
        assert first[0] == [policy.home(key, list(loads))]


def test_policy_falls_back_to_least_loaded_when_home_is_busy():
    policy = AffinityPolicy(busy_threshold=3)
    key = "shared-system-prompt"
    home = policy.home(key, ["a", "b"])
    other = "b" if home == "a" else "a"
    assert policy.rank(key, {home: 2, other: 0})[0] == [home]  # below the threshold: stay home
    assert policy.rank(key, {home: 3, other: 0}) == [[other], [home]]
    assert policy.rank(key, {home: 3, other: 5})[0] == [home]  # everyone busier: stay home
    assert policy.rank(None, {"a": 2, "b": None, "c": 1}) == [["b", "c", "a"]]
    assert policy.rank(key, {}) == []
    with pytest.raises(ConfigError, match="busy_threshold"):
        AffinityPolicy(busy_threshold=0)


def test_unkeyed_requests_take_equally_loaded_replicas_in_turn():
    policy = AffinityPolicy()
    loads = {"a": 0, "b": 0, "c": 1}
    firsts = [policy.rank(None, loads)[0][0] for _ in range(4)]
    assert sorted(set(firsts)) == ["a", "b"] and firsts[0] != firsts[1], firsts  # never c: busier


def test_removing_a_replica_moves_only_its_keys():
    policy = AffinityPolicy()
    keys = [f"k{i}" for i in range(200)]
    before = {k: policy.home(k, ["r0", "r1", "r2"]) for k in keys}
    after = {k: policy.home(k, ["r0", "r2"]) for k in keys}
    assert all(after[k] == before[k] for k in keys if before[k] != "r1")


def test_new_keys_go_to_the_replica_home_to_fewest_keys():
    # The benchmark's shape: 4 shared system prompts over 2 replicas. Placed by hash alone they
    # split 3/1 or 4/0 for most replica-id pairs; a replica that keeps 2 prompts for reuse then
    # evicts on every switch. Learned placement splits them 2/2 whatever the ids are.
    for pair in range(40):
        replicas = [f"bench#{pair}-a", f"bench#{pair}-b"]
        policy = AffinityPolicy()
        homes = [policy.rank(f"system-{i}", dict.fromkeys(replicas, 0))[0][0] for i in range(4)]
        assert sorted(homes.count(r) for r in replicas) == [2, 2], (replicas, homes)
        for i in range(4):  # and each key keeps its home
            assert policy.rank(f"system-{i}", dict.fromkeys(replicas, 0))[0] == [homes[i]]


def test_a_new_replica_takes_the_new_keys_and_old_keys_stay():
    policy = AffinityPolicy()
    old = {k: policy.home(k, ["r0", "r1"]) for k in ("a", "b", "c", "d")}
    assert all(policy.home(k, ["r0", "r1", "r2"]) == old[k] for k in old)
    assert [policy.home(k, ["r0", "r1", "r2"]) for k in ("e", "f")] == ["r2", "r2"]


def test_a_busy_home_sends_elsewhere_without_moving_the_key():
    policy = AffinityPolicy(busy_threshold=2)
    home = policy.home("k", ["a", "b"])
    other = "b" if home == "a" else "a"
    assert policy.rank("k", {home: 5, other: 0}) == [[other], [home]]
    assert policy.rank("k", {home: 0, other: 0})[0] == [home]


def test_placement_memory_is_bounded():
    policy = AffinityPolicy(memory=8)
    for i in range(100):
        policy.home(f"k{i}", ["r0", "r1"])
    assert len(policy._homes) == 8
    with pytest.raises(ConfigError, match="memory"):
        AffinityPolicy(memory=0)


@pytest.mark.parametrize("exc", [
    InvalidRequest("max_tokens", "must be >= 1", 0),
    ContextLengthExceeded(500, 100, 512),
    Overloaded("queue full", retry_after=3.0),
])
def test_errors_cross_the_wire_with_their_class_and_fields(exc):
    back = unpack_error(pickle.loads(pickle.dumps(pack_error(exc))))
    assert type(back) is type(exc) and str(back) == str(exc)
    assert back.http_status == exc.http_status
    assert vars(back) == {k: v for k, v in vars(exc).items()}
    plain = unpack_error(pack_error(RuntimeError("boom")))
    assert isinstance(plain, BackendError) and "boom" in str(plain)


def _snap(hits: int, queries: int, ttft: tuple[int, ...]) -> MetricsSnapshot:
    h = Histogram(buckets=(0.1, 1.0), counts=ttft, sum=0.5, count=ttft[-1])
    return MetricsSnapshot(time_to_first_token=h, time_per_output_token=h, inter_token_latency=h,
                           e2e_latency=h, queue_time=h, running=1, waiting=0, kv_usage=0.5,
                           prefix_cache_queries=queries, prefix_cache_hits=hits, preemptions=0,
                           prompt_tokens=queries, generation_tokens=3, requests_finished={"stop": 1})


def test_replica_metrics_add_up():
    total = combine([_snap(10, 40, (1, 2)), _snap(0, 8, (0, 1))])
    assert total.prefix_cache_hits == 10 and total.prefix_cache_queries == 48
    assert total.time_to_first_token.counts == (1, 3) and total.time_to_first_token.count == 3
    assert total.requests_finished == {"stop": 2} and total.running == 2
    assert combine([]) is None


def _gauged(snap: MetricsSnapshot, running: int, kv_usage: float, capacity: int) -> MetricsSnapshot:
    return attrs.evolve(snap, running=running, waiting=running + 1, kv_usage=kv_usage,
                        kv_capacity_tokens=capacity, kv_used_tokens=capacity // 4,
                        prefix_cache_prompts=running * 2, prefix_cache_host_bytes=capacity * 100)


def test_gauges_add_up_over_live_replicas_only_and_counters_over_all():
    live, dead = _gauged(_snap(10, 40, (1, 2)), 3, 0.5, 1000), _gauged(_snap(5, 8, (0, 1)), 7, 0.9, 600)
    total = combine([live, dead], [live])
    assert (total.running, total.waiting, total.kv_usage) == (3, 4, 0.5)
    assert (total.kv_capacity_tokens, total.kv_used_tokens) == (1000, 250)
    assert (total.prefix_cache_prompts, total.prefix_cache_host_bytes) == (6, 100_000)
    assert total.prefix_cache_hits == 15 and total.requests_finished == {"stop": 2}
    assert total.time_to_first_token.count == 3 and total.generation_tokens == 6
    nobody = combine([live, dead], [])
    assert (nobody.running, nobody.waiting, nobody.kv_usage, nobody.kv_capacity_tokens) == (0, 0, 0.0, 0)
    assert nobody.prompt_tokens == 48


def test_plugin_figures_and_speculation_counters_add_up_by_kind():
    def reported(snap: MetricsSnapshot, updates: float, waiting: float, drafts: int) -> MetricsSnapshot:
        plugins = (PluginMetric(name="sona_updates_total", help="h", kind="counter", value=updates),
                   PluginMetric(name="sona_scores_waiting", help="h", kind="gauge", value=waiting))
        return attrs.evolve(snap, spec_decode_drafts=drafts, spec_decode_draft_tokens=3 * drafts,
                            spec_decode_accepted_tokens=drafts, plugins=plugins)

    live, dead = reported(_snap(1, 2, (0, 1)), 3, 5, 2), reported(_snap(1, 2, (0, 1)), 4, 7, 10)
    total = combine([live, dead], [live])
    assert {m.name: m.value for m in total.plugins} == {"sona_updates_total": 7, "sona_scores_waiting": 5}
    assert (total.spec_decode_drafts, total.spec_decode_draft_tokens, total.spec_decode_accepted_tokens) \
        == (12, 36, 12)
    assert {m.name: m.value for m in combine([live, dead], []).plugins} == {
        "sona_updates_total": 7, "sona_scores_waiting": 0}


def test_a_replica_is_current_while_fresh_or_busy_and_not_seen_dying():
    def report(rid: str, at: float) -> ReplicaMetrics:
        return ReplicaMetrics(replica_id=rid, pid=1, snapshot=_snap(0, 0, (0, 0)), reported_at=at)

    latest = {"fresh": report("fresh", 100.0), "old": report("old", 70.0), "edge": report("edge", 80.0)}

    def ids(**kw) -> list[str]:
        return sorted(m.replica_id for m in current(latest, now=110.0, stale_after=30.0, **kw))

    assert ids() == ["edge", "fresh"]  # 30 s old still counts, 40 s old does not
    assert ids(busy={"old"}) == ["edge", "fresh", "old"]  # a request of ours runs there
    assert ids(busy={"old"}, lost={"old": 90.0, "fresh": 105.0}) == ["edge"]  # died after reporting
    assert ids(lost={"fresh": 50.0}) == ["edge", "fresh"]  # it reported after the death seen
    board = MetricsBoard()
    board.report("fresh", 1, _snap(0, 0, (0, 0)))
    board.retire("fresh")  # Serve stopped it (a redeploy): fresh, busy even, its gauges go
    assert current(board.latest(), now=time.time(), busy={"fresh"}) == []


# ---------------------------------------------------------------- Serve local testing mode

@pytest.fixture(scope="module")
def local_engine():
    pytest.importorskip("ray.serve")
    from ray import serve
    from ruvllm.config import load_config
    from ruvllm.engine.options import EngineOptions
    from ruvllm.plugins import get_registry
    from ruvllm.scaleout.remote_engine import RemoteEngine
    from ruvllm.scaleout.replica import EngineReplica
    from ruvllm.scaleout.tokenizer_host import load_tokenizer_backend

    if get_registry().backends.get("llamacpp") is None:
        pytest.skip("the llamacpp backend is not installed")
    config = load_config(overrides={"backend": "llamacpp", "model": "default"})
    handle = serve.run(serve.deployment(EngineReplica).bind(config, None), _local_testing_mode=True)

    async def make():
        desc = await handle.describe.remote()
        owner = load_tokenizer_backend(config, desc.backend_name)
        return RemoteEngine(handle, desc, owner.tokenizer, options=EngineOptions(), owner=owner)

    loop = asyncio.new_event_loop()
    engine = loop.run_until_complete(make())
    yield loop, engine
    loop.run_until_complete(engine.shutdown())
    loop.close()


def test_remote_engine_streams_greedy_tokens_like_the_engine(local_engine):
    from ruvllm.types import FinishReason, GenerationParams

    loop, engine = local_engine

    async def run():
        ids = await engine.encode_async("The capital of France is")
        assert ids == engine.tokenizer.encode("The capital of France is")  # one tokenizer
        handle = await engine.submit(ids, GenerationParams(max_tokens=8, temperature=0.0))
        outs = [o async for o in handle]
        return outs, await handle.result()

    outs, result = loop.run_until_complete(run())
    assert result.finish_reason is FinishReason.LENGTH and len(result.token_ids) == 8
    assert tuple(o.token_id for o in outs if o.token_id is not None) == result.token_ids
    assert "".join(o.text for o in outs) == result.text == engine.tokenizer.decode(result.token_ids)


def test_remote_engine_cancel_and_submission_errors(local_engine):
    from ruvllm.types import FinishReason, GenerationParams

    loop, engine = local_engine

    async def run():
        ids = await engine.encode_async("Count to one hundred:")
        handle = await engine.submit(ids, GenerationParams(max_tokens=200, temperature=0.0))
        seen = 0
        async for _ in handle:
            seen += 1
            if seen == 3:
                handle.cancel()
        result = await handle.result()
        with pytest.raises(ContextLengthExceeded) as info:
            await engine.submit(ids, GenerationParams(max_tokens=100_000))
        with pytest.raises(InvalidRequest, match="not available through `ruvllm serve --ray`"):
            await engine.submit(ids, GenerationParams(max_tokens=4), logits_processors=[object()])
        for _ in range(50):  # the replica's engine frees the cancelled request's slot
            snap = (await engine.refresh_metrics())[engine._desc.replica_id].snapshot
            if snap.running == 0 and snap.requests_finished.get("cancelled"):
                break
            await asyncio.sleep(0.1)
        return seen, result, info.value, snap

    seen, result, err, snap = loop.run_until_complete(run())
    assert result.finish_reason is FinishReason.CANCELLED and seen == 3
    assert err.http_status == 400
    assert snap.running == 0 and snap.requests_finished.get("cancelled", 0) >= 1
    assert engine.metrics().requests_finished.get("cancelled", 0) >= 1


def test_remote_engine_sends_grammar_recipes_and_the_replica_enforces_them(local_engine):
    from ruvllm.guided import from_extensions
    from ruvllm.guided.request import processors
    from ruvllm.scaleout.remote_engine import _recipes
    from ruvllm.types import GenerationParams

    loop, engine = local_engine
    spec = from_extensions(guided_choice=["alpha", "beta", "gamma"])

    async def run():
        (procs,) = await processors(engine, spec, 1)  # compiled in the ingress, as the app does
        assert _recipes(procs) == (spec,)
        assert pickle.loads(pickle.dumps(spec)) == spec
        ids = await engine.encode_async("Pick a Greek letter:")
        texts = []
        for seed in range(3):
            # Reusing the ingress's processors is safe here: only their recipes cross, and the
            # replica builds fresh ones (with fresh matchers) for every request.
            handle = await engine.submit(ids, GenerationParams(max_tokens=8, temperature=1.0, seed=seed),
                                         logits_processors=procs)
            texts.append((await handle.result()).text)
        return texts

    assert set(loop.run_until_complete(run())) <= {"alpha", "beta", "gamma"}


# ---------------------------------------------------------------- replica death (fake streams)

class _Stream:
    """A replica stream that yields ``items`` then, when ``dies``, raises Ray's actor-died error."""

    def __init__(self, items: list, dies: bool):
        self._items, self._dies, self.cancelled = list(items), dies, False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._items:
            return self._items.pop(0)
        if self._dies:
            from ray.exceptions import ActorDiedError

            raise ActorDiedError()
        raise StopAsyncIteration

    def cancel(self) -> None:
        self.cancelled = True


class _Method:
    def __init__(self, streams: list[_Stream]):
        self.streams, self.calls = streams, 0

    def remote(self, _request):
        self.calls += 1
        return self.streams.pop(0)


class _Feedback:
    """The replicas' ``feedback`` method: records each call, answers nothing (recorded)."""

    def __init__(self):
        self.calls: list = []

    async def remote(self, call):
        self.calls.append(call)


class _Handle:
    def __init__(self, streams: list[_Stream]):
        self.generate = _Method(streams)
        self.feedback = _Feedback()

    def options(self, **_):
        return self


class _Board:
    """The metrics board actor's handle: ``latest.remote()`` gives what ``reports`` holds."""

    def __init__(self, reports: dict):
        self.reports = reports
        self.latest = self

    async def remote(self):
        return dict(self.reports)


def _fake_engine(streams: list[_Stream], *, retries: int = 1, board: _Board | None = None,
                 tenant_affinity: bool = False):
    from ruvllm.engine.options import EngineOptions
    from ruvllm.scaleout.remote_engine import RemoteEngine
    from ruvllm.scaleout.wire import ReplicaDescription
    from ruvllm.types import Capabilities, ModelInfo, SpecialTokens

    info = ModelInfo(name="fake", architecture="llama", context_length=512, vocab_size=100,
                     special_tokens=SpecialTokens(bos_id=None, eos_ids=(0,)))
    desc = ReplicaDescription(info=info, capabilities=Capabilities(),
                              backend_name="fake", path="executor", policy="fcfs", block_size=16,
                              replica_id="r0", pid=1)
    return RemoteEngine(_Handle(streams), desc, tokenizer=None, options=EngineOptions(), retries=retries,
                        board=board, tenant_affinity=tenant_affinity)


def _result(n: int):
    from ruvllm.types import FinishReason, GenerationResult, Timings, Usage

    return GenerationResult(text="x" * n, token_ids=tuple(range(n)), finish_reason=FinishReason.LENGTH,
                            usage=Usage(prompt_tokens=3, completion_tokens=n), timings=Timings())


def test_a_request_whose_replica_died_before_any_token_is_sent_again():
    pytest.importorskip("ray")
    from ruvllm.scaleout.wire import Accepted
    from ruvllm.types import GenerationParams, TokenOutput

    token = TokenOutput(index=0, token_id=0, text="x")
    streams = [_Stream([Accepted("r0", 1)], dies=True),
               _Stream([Accepted("r1", 2), [token], [_result(1)]], dies=False)]
    engine = _fake_engine(streams)

    async def run():
        handle = await engine.submit([1, 2, 3], GenerationParams(max_tokens=1))
        outs = [o async for o in handle]
        return handle, outs, await handle.result()

    handle, outs, result = asyncio.run(run())
    assert outs == [token] and result.token_ids == (0,)
    assert engine._stream_handle.generate.calls == 2 and handle.replica_id == "r1"


def test_feedback_goes_to_the_replica_that_served_the_request():
    pytest.importorskip("ray")
    from ruvllm.errors import FeedbackNotFound
    from ruvllm.scaleout.wire import Accepted
    from ruvllm.types import GenerationParams

    # Resent from r0 (died before its first token) to r1, which answered: feedback goes to r1.
    streams = [_Stream([Accepted("r0", 1)], dies=True),
               _Stream([Accepted("r1", 2), [_result(1)]], dies=False)]
    engine = _fake_engine(streams)

    async def run():
        handle = await engine.submit([1, 2, 3], GenerationParams(max_tokens=1), request_id="cmpl-a-0")
        await handle.result()
        await engine.feedback("cmpl-a-0", 0.5)

    asyncio.run(run())
    (call,) = engine._replicas.feedback.calls
    assert (call.request_id, call.score, call.replica_id) == ("cmpl-a-0", 0.5, "r1")
    with pytest.raises(FeedbackNotFound, match="through this ingress"):
        engine.feedback("cmpl-never-0", 1.0)
    engine._replica_died("r1")  # its learning state died with it
    with pytest.raises(FeedbackNotFound, match="has died since"):
        engine.feedback("cmpl-a-0", 1.0)


def test_tenant_affinity_keys_a_request_by_its_tenant():
    pytest.importorskip("ray")
    from ruvllm.scaleout.prefix_router import prefix_key, tenant_key
    from ruvllm.types import GenerationParams

    prompt = list(range(64))
    by_prefix = prefix_key(prompt, block_size=16, blocks=3)
    engine = _fake_engine([], tenant_affinity=True)
    assert engine._key(prompt, GenerationParams(tenant="alice"), None) == tenant_key("alice") != by_prefix
    assert engine._key(prompt, GenerationParams(), None) == by_prefix  # no tenant: by prefix
    assert _fake_engine([])._key(prompt, GenerationParams(tenant="alice"), None) == by_prefix


def test_a_request_whose_replica_died_mid_stream_fails_clearly():
    pytest.importorskip("ray")
    from ruvllm.scaleout.wire import Accepted
    from ruvllm.types import GenerationParams, TokenOutput

    token = TokenOutput(index=0, token_id=0, text="x")
    streams = [_Stream([Accepted("r0", 1), [token]], dies=True), _Stream([], dies=False)]
    engine = _fake_engine(streams)

    async def run():
        handle = await engine.submit([1, 2, 3], GenerationParams(max_tokens=8))
        outs = []
        with pytest.raises(BackendError, match=r"replica r0 \(pid 1\) died after streaming 1 tokens"):
            async for o in handle:
                outs.append(o)
        with pytest.raises(BackendError):
            await handle.result()
        return outs

    assert asyncio.run(run()) == [token]
    assert engine._stream_handle.generate.calls == 1  # not resent: its client saw part of an answer


def _accepted(replica: str, *items, dies: bool = False) -> _Stream:
    from ruvllm.scaleout.wire import Accepted

    return _Stream([Accepted(replica, int(replica[1:])), *items], dies=dies)


def _dies_before_accepting() -> _Stream:
    return _Stream([], dies=True)


def _answers(replica: str) -> _Stream:
    from ruvllm.types import TokenOutput

    return _accepted(replica, [TokenOutput(index=0, token_id=0, text="x")], [_result(1)])


#: Replica deaths before the request's first token, wherever they strike: before a replica
#: accepted it (in ``_open``) or after (in the handle's stream). docs/scale-out.md promises one
#: resend in all, so each case sends twice at most; the code before this test resent in both
#: places and sent "died, died, died, answers" four times.
RESEND_CASES = {
    "accept-then-die, answered": ([_accepted("r0", dies=True), _answers("r1")], 2, None),
    "die-before-accept, answered": ([_dies_before_accepting(), _answers("r1")], 2, None),
    "die-before-accept twice": ([_dies_before_accepting(), _dies_before_accepting(), _answers("r2")], 2,
                                "no replica could take it"),
    "die-before-accept, accept-then-die": ([_dies_before_accepting(), _accepted("r1", dies=True),
                                            _dies_before_accepting(), _answers("r3")], 2,
                                           r"replica r1 \(pid 1\) died after streaming 0 tokens"),
    "accept-then-die, die-before-accept": ([_accepted("r0", dies=True), _dies_before_accepting(),
                                            _answers("r2")], 2, "no replica could take it"),
    "accept-then-die twice": ([_accepted("r0", dies=True), _accepted("r1", dies=True), _answers("r2")], 2,
                              r"replica r1 \(pid 1\) died after streaming 0 tokens"),
}


@pytest.mark.parametrize("case", RESEND_CASES)
def test_a_request_is_sent_again_once_in_all(case):
    pytest.importorskip("ray")
    from ruvllm.types import GenerationParams

    streams, sends, error = RESEND_CASES[case]
    engine = _fake_engine(list(streams))

    async def run():
        handle = await engine.submit([1, 2, 3], GenerationParams(max_tokens=1))
        outs = [o async for o in handle]
        return outs, await handle.result()

    async def bounded():  # a handle whose resend failed must fail, not hang
        return await asyncio.wait_for(run(), timeout=10)

    if error is None:
        outs, result = asyncio.run(bounded())
        assert [o.text for o in outs] == ["x"] and result.token_ids == (0,)
    else:
        with pytest.raises(BackendError, match=error):
            asyncio.run(bounded())
    assert engine._stream_handle.generate.calls == sends


class _Held(_Stream):
    """A replica stream that, its items given, waits for ``release`` before it ends (or dies)."""

    def __init__(self, items: list, dies: bool):
        super().__init__(items, dies)
        self.release = asyncio.Event()

    async def __anext__(self):
        if not self._items:
            await self.release.wait()
        return await super().__anext__()


def test_the_ingress_counts_its_running_requests_by_replica():
    """``/ray/replicas``' live placement: where a request runs from its acceptance to its end,
    moved with it when it is sent again (the node-loss test picks its victim by it)."""
    pytest.importorskip("ray")
    from ruvllm.scaleout.wire import Accepted
    from ruvllm.types import GenerationParams

    dying, answering = _Held([Accepted("r0", 1)], dies=True), _Held(_answers("r1")._items, dies=False)
    engine = _fake_engine([dying, answering])

    async def run():
        handle = await engine.submit([1, 2, 3], GenerationParams(max_tokens=1))
        await asyncio.sleep(0.01)
        on_first = engine.running_by_replica()
        dying.release.set()
        while engine._stream_handle.generate.calls < 2:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.01)
        on_second = engine.running_by_replica()
        answering.release.set()
        await handle.result()
        await asyncio.sleep(0.01)
        return on_first, on_second, engine.running_by_replica()

    assert asyncio.run(asyncio.wait_for(run(), timeout=10)) == ({"r0": 1}, {"r1": 1}, {})


@pytest.mark.parametrize("where", ["before accepting", "after accepting"])
def test_without_retries_a_request_is_sent_once(where):
    pytest.importorskip("ray")
    from ruvllm.types import GenerationParams

    first = _dies_before_accepting() if where == "before accepting" else _accepted("r0", dies=True)
    engine = _fake_engine([first, _answers("r1")], retries=0)

    async def run():
        handle = await engine.submit([1, 2, 3], GenerationParams(max_tokens=1))
        return [o async for o in handle]

    with pytest.raises(BackendError):
        asyncio.run(asyncio.wait_for(run(), timeout=10))
    assert engine._stream_handle.generate.calls == 1


def test_gauges_forget_a_replica_that_stopped_reporting_or_died_and_counters_keep_it():
    """``metrics()`` over the board's reports: a replica whose last report is older than
    ``stale_after`` leaves running/waiting/KV unless a request of ours runs there; one whose
    stream died leaves them at once; the counters of both stay in the sums."""
    pytest.importorskip("ray")
    import time

    from ruvllm.types import GenerationParams, TokenOutput

    now = time.time()

    def report(rid: str, age: float, running: int, finished: int) -> ReplicaMetrics:
        snap = attrs.evolve(_gauged(_snap(0, 0, (0, 0)), running, 0.5, 1000),
                            requests_finished={"stop": finished})
        return ReplicaMetrics(replica_id=rid, pid=int(rid[1:]), snapshot=snap, reported_at=now - age)

    board = _Board({"r1": report("r1", 1, running=2, finished=10),
                    "r2": report("r2", 600, running=5, finished=20),
                    "r3": report("r3", 600, running=1, finished=30)})
    token = TokenOutput(index=0, token_id=0, text="x")
    # A request that stays on r3 (its stream never ends) and one that dies on r1 mid-stream.
    hang = asyncio.Event()

    class _Open(_Stream):
        async def __anext__(self):
            if not self._items:
                await hang.wait()
            return await super().__anext__()

    engine = _fake_engine([_Open([_accepted("r3")._items[0], [token]], dies=False),
                           _accepted("r1", [token], dies=True)], board=board)
    assert engine.stale_after == 30.0

    async def run():
        await engine.refresh_metrics()
        views = [engine.metrics()]
        on_r3 = await engine.submit([1, 2, 3], GenerationParams(max_tokens=8))
        await asyncio.sleep(0.01)  # its pump starts: r3 runs a request of ours
        views.append(engine.metrics())
        dies = await engine.submit([1, 2, 3], GenerationParams(max_tokens=8))
        with pytest.raises(BackendError, match="died after streaming 1 tokens"):
            async for _ in dies:
                pass
        views.append(engine.metrics())
        on_r3.cancel()
        await asyncio.sleep(0.01)
        views.append(engine.metrics())
        return views

    views = asyncio.run(run())
    # Counters: every replica that ever reported, whatever became of it.
    assert {v.requests_finished["stop"] for v in views} == {60}
    # Gauges: r1 (fresh); + r3 while our request runs there; r1 gone once seen dying.
    assert [(v.running, v.waiting, v.kv_capacity_tokens) for v in views] == [
        (2, 3, 1000), (3, 5, 2000), (1, 2, 1000), (0, 0, 0)]
    assert [v.kv_usage for v in views] == [0.5, 0.5, 0.5, 0.0]


def test_the_remote_engine_offers_everything_the_async_engine_contract_names():
    from ruvllm.errors import FeedbackNotFound
    from ruvllm.serving import missing_members

    engine = _fake_engine([])
    assert missing_members(engine) == []
    assert engine.scheduling_policy == "fcfs" and engine.adapters() is None
    with pytest.raises(FeedbackNotFound, match="served through this ingress"):  # never served here
        engine.feedback("chatcmpl-1-0", 1.0)
