"""Scheduler logic against fake executors: budgets, chunking, preemption, policies, aging."""

from __future__ import annotations

import numpy as np
import pytest
from engine_fakes import EOS, PagedFakeExecutor, ParkingFakeExecutor, PerSeqFakeExecutor, reference_greedy
from ruvllm.engine.block_manager import BlockManager
from ruvllm.engine.request import SchedRequest
from ruvllm.engine.scheduler import Policy, Scheduler, SchedulerConfig
from ruvllm.engine.slots import DonorSlotPool, ParkedDonorPool, SlotPool
from ruvllm.executor import BatchEntry


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(executor, *, budget=64, max_seqs=8, policy="fcfs", prefix=True, aging=5.0, chunk=0, clock=None,
         tail=False, tail_rows=0):
    """A scheduler wired as ExecutorCore wires it (donor slots for a per-sequence executor)."""
    blocks = BlockManager(executor.num_blocks, executor.block_size, enable_prefix_caching=prefix,
                          watermark=0.0)
    max_seqs = min(max_seqs, executor.max_sequences)
    cfg = SchedulerConfig(max_batch_tokens=budget, max_num_seqs=max_seqs, policy=policy,
                          aging_interval=aging, max_prefill_chunk=chunk, split_prompt_tail=tail,
                          split_prompt_tail_rows=tail_rows)
    per_seq = executor.kv_layout == "per_sequence" and prefix
    pool = ParkedDonorPool if getattr(executor, "detached_donors", False) else DonorSlotPool
    slots = (pool(executor.max_sequences, executor.max_sequences - max_seqs, blocks) if per_seq
             else SlotPool(max_seqs))
    return Scheduler(cfg, blocks, clock=clock or Clock(), slots=slots, copy_prefixes=per_seq)


def step(sched: Scheduler, executor, on_admit=None):
    """One engine iteration with greedy sampling; returns the plan."""
    plan = sched.schedule()
    apply_released(sched, executor)
    assert plan.num_tokens <= sched.config.max_batch_tokens
    assert len(sched.running) <= sched.config.max_num_seqs
    if not plan:
        return plan
    if plan.copies:
        executor.copy_blocks(plan.copies)
    for src, dst, n in plan.prefix_copies:
        executor.copy_prefix(src, dst, n)
    entries = [BatchEntry(seq_id=c.request.slot, tokens=c.tokens, start_pos=c.start_pos,
                          block_table=sched.blocks.block_table(c.request.slot), sample=c.sample)
               for c in plan.chunks]
    logits = executor.execute(entries)
    sched.update(plan)
    row = 0
    for c in plan.chunks:
        if not c.sample:
            continue
        req = c.request
        tok = int(np.argmax(logits[row]))
        row += 1
        req.token_ids.append(tok)
        if tok == EOS or req.num_output >= req.max_tokens:
            sched.finish(req)
    sched.end_step()
    apply_released(sched, executor)
    sched.blocks.check_invariants()
    return plan


def apply_released(sched: Scheduler, executor) -> None:
    retire = getattr(executor, "retire", None) or executor.trim
    for slot, keep in sched.take_released_slots():
        if keep:  # a prefix donor
            retire(slot, keep)
        else:
            executor.free(slot)


def run_all(sched, executor, reqs, max_steps=5000):
    for r in reqs:
        sched.add(r)
    steps = 0
    while sched.has_work:
        step(sched, executor)
        steps += 1
        assert steps < max_steps, "scheduler made no progress"
    assert sched.blocks.num_used_blocks == 0
    return {r.request_id: r.token_ids[r.num_prompt:] for r in reqs}


def prompts(n, seed=0, lo=3, hi=30):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, 38, size=int(rng.integers(lo, hi)))] for _ in range(n)]


def requests(ps, max_tokens=12):
    return [SchedRequest(f"r{i}", list(p), max_tokens) for i, p in enumerate(ps)]


@pytest.mark.parametrize("executor_cls", [PagedFakeExecutor, PerSeqFakeExecutor])
def test_batched_output_equals_each_alone(executor_cls):
    ps = prompts(12)
    ex = executor_cls(num_blocks=200, block_size=4, max_sequences=8)
    out = run_all(make(ex, prefix=executor_cls is PagedFakeExecutor), ex, requests(ps))
    for i, p in enumerate(ps):
        assert out[f"r{i}"] == reference_greedy(p, 12)


def test_budget_is_never_exceeded_and_long_prompts_are_chunked():
    ps = prompts(6, seed=1, lo=20, hi=40)
    ex = PagedFakeExecutor(num_blocks=200, block_size=4, max_batch_tokens=7)
    sched = make(ex, budget=7)
    out = run_all(sched, ex, requests(ps))
    assert all(sum(len(e.tokens) for e in s) <= 7 for s in ex.steps)
    assert any(not e.sample for s in ex.steps for e in s), "no prompt was chunked"
    # Decodes and prefill chunks share steps (continuous batching, not phases).
    assert any(any(e.sample and len(e.tokens) == 1 for e in s) and any(not e.sample for e in s)
               for s in ex.steps)
    for i, p in enumerate(ps):
        assert out[f"r{i}"] == reference_greedy(p, 12)


def test_max_prefill_chunk_caps_one_request_per_step():
    ex = PagedFakeExecutor(num_blocks=200, block_size=4)
    sched = make(ex, chunk=5)
    p = prompts(1, seed=2, lo=25, hi=26)[0]
    out = run_all(sched, ex, requests([p]))
    assert max(len(e.tokens) for s in ex.steps for e in s) == 5
    assert out["r0"] == reference_greedy(p, 12)


@pytest.mark.parametrize("tail", [False, True])
def test_split_prompt_tail_prefills_the_rows_a_repeat_recomputes_by_themselves(tail):
    """With ``split_prompt_tail`` a 23-token prompt (blocks of 4) is prefilled as [0, 20) then
    [20, 23): the same chunk its repeat computes after a prefix-cache hit on 20 tokens."""
    p = prompts(1, seed=2, lo=23, hi=24)[0]
    ex = PagedFakeExecutor(num_blocks=100, block_size=4)
    sched = make(ex, tail=tail)
    first = run_all(sched, ex, [SchedRequest("a", list(p), 6)])
    first_steps = len(ex.steps)
    again = run_all(sched, ex, [SchedRequest("b", list(p), 6)])
    chunks = [(e.start_pos, e.start_pos + len(e.tokens)) for s in ex.steps for e in s if len(e.tokens) > 1]
    n_first = sum(len(e.tokens) > 1 for s in ex.steps[:first_steps] for e in s)
    assert chunks[n_first:] == [(20, 23)]
    assert chunks[:n_first] == ([(0, 20), (20, 23)] if tail else [(0, 23)])
    assert first["a"] == again["b"] == reference_greedy(p, 6)


@pytest.mark.parametrize("tail_rows", [23, 24])
def test_a_prompt_alone_under_split_prompt_tail_rows_is_prefilled_in_one_step(tail_rows):
    """Alone in its step, a 23-token prompt is split only when its 23 rows reach the executor's
    other kernel (``split_prompt_tail_rows``); its repeat still recomputes [20, 23)."""
    p = prompts(1, seed=2, lo=23, hi=24)[0]
    ex = PagedFakeExecutor(num_blocks=100, block_size=4)
    sched = make(ex, tail=True, tail_rows=tail_rows)
    first = run_all(sched, ex, [SchedRequest("a", list(p), 6)])
    chunks = [(e.start_pos, e.start_pos + len(e.tokens)) for s in ex.steps for e in s if len(e.tokens) > 1]
    assert chunks == ([(0, 23)] if tail_rows > 23 else [(0, 20), (20, 23)])
    assert first["a"] == reference_greedy(p, 6)


def test_a_prompt_beside_other_requests_is_still_split():
    """With another request waiting (or running), the prompt's step may hold more rows than its
    own: it keeps the split, whatever ``split_prompt_tail_rows``."""
    ps = prompts(2, seed=2, lo=23, hi=24)
    ex = PagedFakeExecutor(num_blocks=100, block_size=4)
    sched = make(ex, tail=True, tail_rows=64, budget=128)
    run_all(sched, ex, [SchedRequest("a", list(ps[0]), 6), SchedRequest("b", list(ps[1]), 6)])
    first_step = [(e.start_pos, e.start_pos + len(e.tokens)) for e in ex.steps[0]]
    assert first_step == [(0, 20), (0, 20)]


@pytest.mark.parametrize("executor_cls", [PagedFakeExecutor, PerSeqFakeExecutor])
@pytest.mark.parametrize("policy", ["fcfs", "priority", "sjf"])
def test_preemption_by_recompute_gives_identical_greedy_output(executor_cls, policy):
    ps = prompts(8, seed=3, lo=6, hi=14)
    # 14 blocks of 4 tokens cannot hold 8 requests of ~10 + 16 tokens: preemption must happen.
    ex = executor_cls(num_blocks=14, block_size=4, max_sequences=8)
    sched = make(ex, policy=policy, prefix=executor_cls is PagedFakeExecutor)
    reqs = requests(ps, max_tokens=16)
    for i, r in enumerate(reqs):
        r.priority = i % 3
    out = run_all(sched, ex, reqs)
    assert sched.num_preemptions > 0
    for i, p in enumerate(ps):
        assert out[f"r{i}"] == reference_greedy(p, 16)


@pytest.mark.parametrize("executor_cls", [PagedFakeExecutor, PerSeqFakeExecutor])
def test_prefix_cache_hit_gives_the_same_output_as_a_miss(executor_cls):
    shared = prompts(1, seed=4, lo=17, hi=18)[0]
    ps = [[*shared, i, i + 1, i + 2] for i in range(5)]
    ex = executor_cls(num_blocks=100, block_size=4, max_sequences=4)
    sched = make(ex, max_seqs=2)  # per-sequence: 2 running slots + 2 donor slots
    out = {}
    for i, p in enumerate(ps):  # one after another, so later ones find the earlier blocks
        out.update(run_all(sched, ex, [SchedRequest(f"r{i}", list(p), 10)]))
    assert sched.prefix_hits >= 4 * 16
    for i, p in enumerate(ps):
        assert out[f"r{i}"] == reference_greedy(p, 10)


def test_two_donor_slots_keep_two_alternating_prefixes():
    """Two system prompts alternating over one running slot and two donor slots: every request
    after the first of each prompt finds its whole prompt head. When a donor kept the head
    after another request copied it, each use added a donor for the same head and pushed the
    other head out (measured through Ray: 4 prompts over 2 replicas with 2 slots each)."""
    heads = [prompts(1, seed=20 + i, lo=16, hi=17)[0] for i in range(2)]
    order = [0, 0, 1, 0, 1, 1, 0, 1, 1, 0]
    ex = PerSeqFakeExecutor(num_blocks=100, block_size=4, max_sequences=3)
    sched = make(ex, max_seqs=1)  # 1 running slot + 2 donor slots
    for n, h in enumerate(order):
        p = [*heads[h], 30 + n, 31 + n]
        before = sched.prefix_hits
        out = run_all(sched, ex, [SchedRequest(f"r{n}", list(p), 3)])
        assert out[f"r{n}"] == reference_greedy(p, 3)
        first_use = order.index(h) == n
        assert sched.prefix_hits - before == (0 if first_use else 16), (n, h)
        assert sched.slots.num_donors <= 2
    sched.blocks.check_invariants()


def test_a_head_copied_from_a_running_sequence_outlives_its_tail():
    """r1 copies head A from r0 while r0 still runs, and finishes first; r0 then finishes
    holding only its own tail. That tail goes first in the eviction order, so after a request
    on head B the two donor slots hold heads A and B, and A hits again."""
    head_a, head_b = (prompts(1, seed=30 + i, lo=16, hi=17)[0] for i in range(2))
    ex = PerSeqFakeExecutor(num_blocks=100, block_size=4, max_sequences=4)
    sched = make(ex, max_seqs=2)  # 2 running slots + 2 donor slots
    r0 = SchedRequest("r0", [*head_a, 30, 31], 12)
    sched.add(r0)
    step(sched, ex)  # r0's prompt is computed and its head cached
    r1 = SchedRequest("r1", [*head_a, 32, 33], 2)
    hits = sched.prefix_hits
    run_all(sched, ex, [r1])
    assert sched.prefix_hits - hits == 16
    assert r0.token_ids[r0.num_prompt:] == reference_greedy([*head_a, 30, 31], 12)
    run_all(sched, ex, [SchedRequest("b", [*head_b, 34, 35], 3)])
    hits = sched.prefix_hits
    again = [*head_a, 36, 37]
    assert run_all(sched, ex, [SchedRequest("a", list(again), 3)])["a"] == reference_greedy(again, 3)
    assert sched.prefix_hits - hits == 16


def test_identical_prompts_share_cached_blocks_and_write_privately():
    # Two requests whose prompts are identical share every cached full block; generated
    # tokens then go into private blocks, never into the shared ones.
    p = prompts(1, seed=5, lo=13, hi=14)[0]
    ex = PagedFakeExecutor(num_blocks=100, block_size=4)
    sched = make(ex)
    first = run_all(sched, ex, [SchedRequest("a", list(p), 9)])
    both = run_all(sched, ex, [SchedRequest("b", list(p), 9), SchedRequest("c", list(p), 9)])
    assert first["a"] == both["b"] == both["c"] == reference_greedy(p, 9)


def test_priority_policy_admits_in_priority_order():
    ex = PagedFakeExecutor(num_blocks=100, block_size=4, max_sequences=1)
    sched = make(ex, policy="priority", max_seqs=1)
    order = []
    reqs = [SchedRequest(name, [1, 2, 3], 2, priority=prio) for name, prio in
            (("low", -1), ("normal", 0), ("high", 1), ("critical", 2))]
    for r in reqs:
        sched.add(r)
    while sched.has_work:
        step(sched, ex)
        for r in sched.running:
            if r.request_id not in order:
                order.append(r.request_id)
    assert order == ["critical", "high", "normal", "low"]


def test_sjf_runs_short_jobs_first():
    ex = PagedFakeExecutor(num_blocks=100, block_size=4, max_sequences=1)
    sched = make(ex, policy=Policy.SJF, max_seqs=1)
    for name, n in (("long", 30), ("short", 2), ("mid", 10)):
        sched.add(SchedRequest(name, [1, 2, 3], n))
    order = []
    while sched.has_work:
        step(sched, ex)
        for r in sched.running:
            if r.request_id not in order:
                order.append(r.request_id)
    assert order == ["short", "mid", "long"]


def _admission_step_of_low(aging: float) -> int | None:
    """A low-priority request competes with a stream of new high-priority ones (one slot)."""
    clock = Clock()
    ex = PagedFakeExecutor(num_blocks=100, block_size=4, max_sequences=1)
    sched = make(ex, policy="priority", max_seqs=1, aging=aging, clock=clock)
    low = SchedRequest("low", [1, 2, 3], 1, priority=-1, arrival=0.0)
    sched.add(low)
    for t in range(200):
        clock.now = float(t)
        sched.add(SchedRequest(f"h{t}", [4, 5, 6], 1, priority=1, arrival=clock.now))
        step(sched, ex)
        if low.first_scheduled is not None:
            return t
    return None


def test_aging_prevents_starvation_of_low_priority():
    # One priority level per 5 s of waiting: the 2-level gap closes after ~10 s.
    t = _admission_step_of_low(aging=5.0)
    assert t is not None and t <= 15
    # Control: with aging effectively off the same low request starves for the whole run.
    assert _admission_step_of_low(aging=1e9) is None


def test_finish_while_waiting_or_running_frees_everything():
    ex = PagedFakeExecutor(num_blocks=30, block_size=4, max_sequences=2)
    sched = make(ex, max_seqs=2)
    reqs = requests(prompts(5, seed=6), max_tokens=20)
    for r in reqs:
        sched.add(r)
    step(sched, ex)
    step(sched, ex)
    for r in reqs:  # cancel everything: running and waiting alike
        sched.finish(r)
    assert not sched.has_work
    assert sched.blocks.num_used_blocks == 0
    sched.blocks.check_invariants()


def test_config_rejects_bad_values_by_name():
    from ruvllm.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="max_batch_tokens"):
        SchedulerConfig(max_batch_tokens=0)
    with pytest.raises(ValueError):
        SchedulerConfig(policy="lottery")


def test_a_parked_donor_is_restored_beside_a_running_copy_of_its_head_into_blocks_of_its_own():
    """r0's prompt (head H, then X) ends parked. r1 (H, then Y) restores H from it and keeps
    running; r2 (H, X, then Z) finds H and X in the parked donor, but restoring them into H's
    cached blocks would hold H twice (r1's cells and the restore's) where the engine counts it
    once. So the restore goes into blocks of r2's own, and the cells stay within the engine's
    account."""
    head, x, y, z = prompts(4, seed=40, lo=8, hi=9)
    ex = ParkingFakeExecutor(num_blocks=40, block_size=4, max_sequences=3)
    sched = make(ex, max_seqs=2)  # 2 running slots + 1 donor slot
    run_all(sched, ex, [SchedRequest("r0", [*head, *x], 2)])
    # All its KV: the prompt and the generated token fed back (the last one never is).
    assert list(ex.parked.values()) == [[*head, *x, *reference_greedy([*head, *x], 1)]]
    r1 = SchedRequest("r1", [*head, *y], 30)
    sched.add(r1)
    step(sched, ex)
    assert ex.restored == 1 and r1.num_cached_tokens == 8
    r2 = SchedRequest("r2", [*head, *x, *z], 2)
    sched.add(r2)
    step(sched, ex)
    assert ex.restored == 2 and r2.num_cached_tokens == 16
    assert not set(sched.blocks.block_table(r1.slot)) & set(sched.blocks.block_table(r2.slot))
    while sched.has_work:
        step(sched, ex)
        assert ex.cells_used <= sched.blocks.num_resident_blocks * ex.block_size
    assert r2.token_ids[r2.num_prompt:] == reference_greedy([*head, *x, *z], 2)


@pytest.mark.parametrize(("parking", "length", "hit"), [
    (True, 23, 22),   # parked: the partial block past the chain too
    (True, 24, 23),
    (False, 23, 20),  # in the pool a donor keeps whole blocks only (the engine's account)
    (False, 24, 23),  # ... but a hit may run on into its last one
])
def test_a_repeated_prompt_recomputes_only_what_no_donor_holds(parking, length, hit):
    """Blocks of 4: a repeat finds every position a donor holds with its tokens, up to but not
    including the prompt's last token, not just the leading whole blocks (which left up to a
    block of rows to recompute, where llama-server recomputes one)."""
    p = prompts(1, seed=50, lo=length, hi=length + 1)[0]
    kind = ParkingFakeExecutor if parking else PerSeqFakeExecutor
    ex = kind(num_blocks=40, block_size=4, max_sequences=3)
    sched = make(ex, max_seqs=2)
    # One new token each, so the first request's KV ends with its prompt (a generated token's
    # KV would fill the partial block).
    first = run_all(sched, ex, [SchedRequest("a", list(p), 1)])
    again = SchedRequest("b", list(p), 1)
    assert run_all(sched, ex, [again]) == {"b": first["a"]} and first["a"] == reference_greedy(p, 1)
    assert sched.prefix_hits == again.num_cached_tokens == hit


def test_a_parked_prompt_outlives_the_blocks_a_running_request_takes():
    """A's prompt ends parked (three whole blocks and a token). L1 then grows until the pool
    reuses one of A's blocks, while L2 comes and goes. A sent again, L1 still running, finds
    all of its prompt but the last token in the parked KV, not just the head of blocks the pool
    kept (8 tokens): the parked copy costs the pool nothing, so it stays findable by its tokens."""
    a, l1, l2 = (prompts(1, seed=60 + i, lo=n, hi=n + 1)[0] for i, n in enumerate((13, 6, 6)))
    ex = ParkingFakeExecutor(num_blocks=16, block_size=4, max_sequences=5)
    sched = make(ex, max_seqs=2)
    run_all(sched, ex, [SchedRequest("a", list(a), 1)])
    long_one = SchedRequest("l1", list(l1), 42)
    for r in (long_one, SchedRequest("l2", list(l2), 3)):
        sched.add(r)
    step(sched, ex)
    while len(sched.blocks.block_table(long_one.slot)) < 12:  # 48 positions: A's blocks are needed
        step(sched, ex)
    again = SchedRequest("again", list(a), 1)
    sched.add(again)
    step(sched, ex)
    assert long_one.state.name == "RUNNING" and again.num_cached_tokens == len(a) - 1
    run_all(sched, ex, [])
    assert again.token_ids[again.num_prompt:] == reference_greedy(a, 1)
    assert long_one.token_ids[long_one.num_prompt:] == reference_greedy(l1, 42)


def test_parked_prompts_sharing_a_long_head_stay_within_the_pools_size():
    """Eight prompts of one 24-token head and a question of their own each end parked. Each
    parks its whole KV, the shared head too, so their bytes are bounded by a count of their
    own, the pool's size (80 positions here: two of them), the least recently used going first;
    the blocks they share counted once let eight stay, 224 positions in all."""
    head = prompts(1, seed=70, lo=24, hi=25)[0]
    ex = ParkingFakeExecutor(num_blocks=20, block_size=4, max_sequences=9)
    sched = make(ex, max_seqs=1)  # 1 running slot + 8 donor slots
    for i in range(8):
        run_all(sched, ex, [SchedRequest(f"q{i}", [*head, 30 + i, 31, 32, 33], 1)])
        assert sum(map(len, ex.parked.values())) <= 80
    assert sched.slots.num_donors == 2
    last = [*head, 37, 31, 32, 33]
    again = SchedRequest("again", list(last), 1)
    assert run_all(sched, ex, [again]) == {"again": reference_greedy(last, 1)}
    assert again.num_cached_tokens == len(last) - 1


def test_a_conversations_later_turn_replaces_its_earlier_one():
    """Each turn of a conversation resends the whole of it: the finished turn's parked KV holds
    all of the one before, so the earlier donor goes (one donor, one copy of the KV)."""
    turn = prompts(1, seed=80, lo=10, hi=11)[0]
    ex = ParkingFakeExecutor(num_blocks=40, block_size=4, max_sequences=4)
    sched = make(ex, max_seqs=1)  # 1 running slot + 3 donor slots
    for n in range(3):
        req = SchedRequest(f"t{n}", list(turn), 3)
        run_all(sched, ex, [req])
        assert sched.slots.num_donors == 1 and list(ex.parked.values()) == [req.token_ids[:-1]]
        if n:
            assert req.num_cached_tokens == len(turn) - 1 - 4
        turn = [*req.token_ids, 5, 6, 7, 8]


def test_a_hit_stops_where_the_prompt_leaves_the_donors_tokens():
    """A prompt that shares its first 21 tokens with a parked donor's, then differs: the hit
    takes those 21 (five blocks and one token of the sixth), and the output is the new prompt's
    own."""
    p = prompts(1, seed=51, lo=23, hi=24)[0]
    q = [*p[:21], (p[21] + 1) % 38, *p[22:]]
    ex = ParkingFakeExecutor(num_blocks=40, block_size=4, max_sequences=3)
    sched = make(ex, max_seqs=2)
    run_all(sched, ex, [SchedRequest("a", list(p), 3)])
    other = SchedRequest("b", list(q), 3)
    assert run_all(sched, ex, [other]) == {"b": reference_greedy(q, 3)}
    assert other.num_cached_tokens == 21


@pytest.mark.parametrize("parking", [False, True], ids=["donors_in_pool", "donors_parked"])
@pytest.mark.parametrize("donors", [0, 1, 3])
def test_per_sequence_prefix_cache_under_churn_stays_exact(donors, parking):
    """Shared prefixes, KV pressure (preemption), donor eviction and cancellations at once:
    every finished output equals the reference and no block or slot leaks. With donors parked
    outside the pool, every restore must also find free cells (the fake asserts it)."""
    rng = np.random.default_rng(7)
    heads = [prompts(1, seed=10 + i, lo=9, hi=14)[0] for i in range(3)]
    ps = [[*heads[i % 3], *map(int, rng.integers(0, 38, size=int(rng.integers(1, 6))))] for i in range(24)]
    kind = ParkingFakeExecutor if parking else PerSeqFakeExecutor
    ex = kind(num_blocks=30, block_size=4, max_sequences=3 + donors)
    sched = make(ex, max_seqs=3, budget=16)
    reqs = [SchedRequest(f"r{i}", list(p), 8) for i, p in enumerate(ps)]
    cancelled = set()
    for i, r in enumerate(reqs):
        sched.add(r)
        step(sched, ex)
        if i % 7 == 3:
            sched.finish(r)  # cancel, wherever it is
            cancelled.add(r.request_id)
    guard = 0
    while sched.has_work:
        step(sched, ex)
        # The executor's cells never exceed the engine's account (a restored copy beside a
        # running one would hold a shared prefix twice).
        assert ex.cells_used <= sched.blocks.num_resident_blocks * ex.block_size
        guard += 1
        assert guard < 3000
    assert sched.prefix_hits > 0
    if parking and donors:
        assert ex.restored > 0
    for i, r in enumerate(reqs):
        if r.request_id not in cancelled:
            assert r.token_ids[r.num_prompt:] == reference_greedy(ps[i], 8)
    assert sched.blocks.num_used_blocks == 0
    assert sched.slots.num_donors <= donors
    sched.blocks.check_invariants()
