"""SONA proof: the served model learns a user's preference (short answers, see sona_task.py) from
feedback alone while it serves, beyond noise, without forgetting.

Per seed (each seed changes the sampling, the order of the training prompts and SONA's own init):

1. base: the held-out prompts (other topics than training) answered by the base model, and by the
   base model with the instruction appended (what a user gets without learning);
2. SONA online: ``--rounds`` rounds; each serves ``--per-round`` training prompts through the real
   ServingEngine (sampled, batched), scores every answer with the program-given reward, sends the
   scores through ``engine.feedback`` (the path ``POST /v1/feedback`` takes) and runs the
   background loop, then the deep loop (consolidation into the base LoRA, pattern bank);
3. ablations: without the pattern bank, the same learned weights on every request (no routing);
   without EWC++, and (``--ablate-deep``) without the deep loop, a SONA fed the online run's served
   answers and scores in the same rounds (the same feedback events, replayed);
4. upper bound: an offline LoRA of the same rank and layers fine-tuned on the same rated examples
   for ``--offline-epochs`` passes;
5. each variant answers the held-out prompts with the seed's sampling seeds; held-out perplexity on
   general text with the variant's adapter.

The ratio's 95 % interval is a paired bootstrap over (prompt, seed) cells (sona_stats.py). Costs:
the instant loop timed around the engine's call for every finished request while it serves, the
background loop's seconds per update, serving throughput at C=16 with and without learning (same
run), and the memory one tenant's adapter takes. Reset is checked against the base greedy output.

    .venv/bin/python benchmarks/sona_learning.py   # ~3 min on 2 AVX-512 cores, ~14 on AVX2

Not under ``nice``: run it as a server runs (niceness 0). SONA's background thread trains under
SCHED_IDLE by default (``background_priority``); with a niceness instead, a process already at 10
leaves the thread only 9 steps below serving, and the throughput beside updates reads low.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
import torch
from ruvllm.bench.machine import machine_line
from ruvllm.chat import render_chat
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.models import ModelSource
from ruvllm.registry import embedded_model_path
from ruvllm.types import GenerationParams, Trajectory
from ruvllm_candle_like.backend import CandleLikeBackend
from ruvllm_candle_like.lora import LoraPlan
from ruvllm_sona import SonaOptions, attach, detach
from ruvllm_sona.controller import Sona
from ruvllm_sona.trainer import perplexity, training_dtype
from sona_costs import WINDOWS, adapter_bytes, throughput
from sona_offline import offline_adapter
from sona_plot import plot
from sona_stats import rate_ratio
from sona_task import (
    GENERAL_TEXT,
    HELD_OUT_TOPICS,
    MAX_TOKENS,
    TOPIC_KINDS,
    is_short,
    questions,
    train_topics,
)

GREEDY_CHECK = ["The capital of France is", "Tell me briefly about a lighthouse.",
                "List three primary colors:"]
VARIANTS = ("SONA", "no EWC++", "no pattern bank", "no deep loop", "offline LoRA")


class Clock:
    def __init__(self) -> None:
        self.start = time.perf_counter()

    def say(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.start:6.0f} s] {text}", flush=True)


def chat_ids(backend, text: str) -> list[int]:
    st = backend.info.special_tokens
    rendered = render_chat(backend.info.chat_template, [{"role": "user", "content": text}],
                           bos_token=st.bos_text, eos_token=st.eos_text)
    return backend.tokenizer.encode(rendered, add_special=False, parse_special=True)


def serve(engine, prompts, seed: int, temperature: float, adapters=None, skip=frozenset(),
          max_tokens: int = MAX_TOKENS):
    """One sampled answer per prompt (but those at indices in ``skip``), all submitted at once
    (batched); ``adapters[i]`` is the adapter prompt i runs with. Prompt i's sampling seed
    depends on ``seed`` and i only, so every variant samples a prompt with the same seed."""
    adapters = adapters or [None] * len(prompts)
    handles = [(i, engine.submit_sync(p, GenerationParams(max_tokens=max_tokens, temperature=temperature,
                                                          seed=seed * 10_000 + i, adapter=adapters[i])))
               for i, p in enumerate(prompts) if i not in skip]
    return {i: (h.request_id, h.result()) for i, h in handles}




def greedy(engine, backend, max_tokens=24):
    """One request at a time, so each check prompt runs in the same batch shape every time."""
    params = GenerationParams(max_tokens=max_tokens)
    return [list(engine.submit_sync(backend.tokenizer.encode(t), params).result().token_ids)
            for t in GREEDY_CHECK]


def sona_options(args, seed: int, **over) -> SonaOptions:
    base = dict(rank=args.rank, alpha=args.alpha, learning_rate=args.lr, steps_per_update=args.steps,
                batch_size=args.batch, ewc_lambda=args.ewc_lambda, layers=args.layers,
                max_seq_len=args.max_seq_len, fisher_batch=args.fisher_batch, interval=0, seed=seed,
                targets=tuple(args.targets), background_priority=args.background_priority,
                apply="routed", route_threshold=args.route_threshold)
    return SonaOptions(**{**base, **over})


def online(engine, backend, args, seed: int, train_prompts, clock: Clock) -> tuple[Sona, list, dict]:
    """SONA attached to the serving engine, learning from the feedback on what it serves. Returns
    it, each round's (trajectory, score) events, and the costs seen."""
    sona = attach(engine, sona_options(args, seed), start=False)
    order = random.Random(seed).sample(range(len(train_prompts)), len(train_prompts))
    served: list[float] = []
    original = engine._finished

    def timed(*a):  # the engine's whole serving-path cost of the instant loop, per request
        t = time.perf_counter()
        original(*a)
        served.append(time.perf_counter() - t)

    engine._finished = timed
    rounds, updates = [], []
    try:
        for r in range(args.rounds):
            picked = [order[(r * args.per_round + i) % len(order)] for i in range(args.per_round)]
            prompts = [train_prompts[i] for i in picked]
            results = serve(engine, prompts, seed * 100 + r, args.temperature, max_tokens=args.max_tokens)
            events = []
            for prompt, (rid, res) in zip(prompts, results.values(), strict=True):
                score = 1.0 if is_short(res, args.max_tokens) else args.miss_score
                engine.feedback(rid, score)
                events.append((Trajectory(request_id=rid, prompt_ids=tuple(prompt), output_ids=res.token_ids),
                               score))
            stats = sona.background_step() or {}
            updates.append(stats.get("seconds", 0.0))
            deep = sona.deep("round") if args.deep else {}
            rounds.append(events)
            n_hit = sum(s > 0 for _, s in events)
            clock.say(f"  seed {seed} round {r + 1}/{args.rounds}: {n_hit}/{len(events)} short, loss "
                      f"{stats.get('loss', 0):.3f}, update {stats.get('seconds', 0):.1f} s, "
                      f"patterns {deep.get('patterns', 0)}")
    finally:
        engine._finished = original
    costs = {"instant_served_s": served, "instant_hook_s": list(sona.instant_seconds), "update_s": updates}
    return sona, rounds, costs


def replay(engine, args, seed: int, rounds, *, deep: bool, **over) -> Sona:
    """A SONA (not attached: it sees only these events) fed the online run's events round by round."""
    sona = Sona(engine, sona_options(args, seed, **over))
    for events in rounds:
        for trajectory, score in events:
            sona.on_finished(trajectory)
            sona.feedback(trajectory.request_id, score)
        sona.background_step()
        if deep:
            sona.deep("round")
    return sona


def served_name(sona: Sona) -> str:
    """The adapter SONA's requests run with: the pattern bank's snapshot once there is one."""
    bank = sona.learner().bank
    return bank.patterns[0].adapter if bank.patterns else sona.adapter_name()


def evaluate(engine, backend, args, seed, eval_prompts, general_ids, choose, adapter_name=None,
             known: dict[int, int] | None = None) -> dict:
    """Held-out hits and held-out perplexity (the adapter on the general text, whatever routes).
    ``known``: hits already measured for some prompts with the same weights and sampling seed."""
    known = known or {}
    adapters = [choose(p) for p in eval_prompts]
    results = serve(engine, eval_prompts, seed, args.temperature, adapters, skip=frozenset(known),
                    max_tokens=args.max_tokens)
    out = np.array([known[i] if i in known else is_short(results[i][1], args.max_tokens)
                    for i in range(len(eval_prompts))],
                   dtype=np.int8)
    adapter = backend.adapters.get(adapter_name) if adapter_name else None
    ppl = perplexity(backend.model, general_ids, LoraPlan([(adapter, None)]) if adapter else None)
    return {"hits": out, "perplexity": ppl, "adapters": adapters,
            "routed": sum(a is not None for a in adapters) / len(adapters),
            "general_routed": choose(general_ids[:128]) is not None}


def unload(engine, backend, names) -> None:
    def drop() -> None:
        for n in names:
            if n in backend.adapter_names():
                backend.unload_adapter(n)

    engine.publish(drop).result()


def one_seed(engine, backend, args, seed, train_prompts, eval_prompts, instructed, general_ids, clock):
    res: dict[str, dict] = {}
    res["base"] = evaluate(engine, backend, args, seed, eval_prompts, general_ids, lambda p: None)
    res["instructed"] = evaluate(engine, backend, args, seed, instructed, general_ids, lambda p: None)
    clock.say(f"seed {seed}: base {res['base']['hits'].sum()}/{len(eval_prompts)} short, with the "
              f"instruction {res['instructed']['hits'].sum()}/{len(eval_prompts)}")
    sona, rounds, costs = online(engine, backend, args, seed, train_prompts, clock)
    detach(engine)  # evaluated like the ablations: each request gets what the SONA would route it to
    last = served_name(sona)
    res["SONA"] = evaluate(engine, backend, args, seed, eval_prompts, general_ids,
                           lambda p: sona.select_adapter(tuple(p)), last)
    # Without the bank's routing: the same learned weights on every request. Prompts the bank
    # routed ran those weights already, with the same sampling seed: their answers are reused.
    done = res["SONA"]
    routed = {i: int(h) for i, (a, h) in enumerate(zip(done["adapters"], done["hits"], strict=True)) if a}
    res["no pattern bank"] = evaluate(engine, backend, args, seed, eval_prompts, general_ids,
                                      lambda p: sona.adapter_name(), sona.adapter_name(), routed)
    no_ewc = replay(engine, args, seed, rounds, deep=args.deep, ewc_lambda=0.0, adapter_name="noewc")
    res["no EWC++"] = evaluate(engine, backend, args, seed, eval_prompts, general_ids,
                               lambda p: no_ewc.select_adapter(tuple(p)), served_name(no_ewc))
    replays = [no_ewc]
    if args.ablate_deep:
        no_deep = replay(engine, args, seed, rounds, deep=False, apply="all", adapter_name="nodeep")
        res["no deep loop"] = evaluate(engine, backend, args, seed, eval_prompts, general_ids,
                                       lambda p: "nodeep", "nodeep")
        replays.append(no_deep)
    rated = [e for events in rounds for e in events if e[1] != 0]
    adapter = offline_adapter(backend, sona_options(args, seed), rated, epochs=args.offline_epochs,
                              name="offline")
    engine.publish(lambda: backend.publish_adapter(adapter)).result()
    res["offline LoRA"] = evaluate(engine, backend, args, seed, eval_prompts, general_ids,
                                   lambda p: "offline", "offline")
    costs["adapter_bytes"] = adapter_bytes(sona.learner())
    line = ", ".join(f"{v} {res[v]['hits'].sum()}" for v in VARIANTS if v in res)
    clock.say(f"seed {seed}: held-out short answers {line} (of {len(eval_prompts)})")
    for s in replays:
        s.reset()
    unload(engine, backend, ["offline"])
    return res, costs, sona


def table(per_seed: list[dict], base_ppl: float, costs: list[dict], extra: dict) -> dict:
    base = np.concatenate([r["base"]["hits"] for r in per_seed])
    rows = {}
    print(f"\n{'variant':24} {'held-out rate':>14} {'x base':>7} {'95% CI':>15} {'perplexity':>12}")
    for name in ("instructed", *(v for v in VARIANTS if v in per_seed[0])):
        v = np.concatenate([r[name]["hits"] for r in per_seed])
        ratio = rate_ratio(v, base)
        ppl = float(np.mean([r[name]["perplexity"] for r in per_seed]))
        label = "base + instruction" if name == "instructed" else name
        print(f"{label:24} {ratio.base_rate:.3f} -> {ratio.rate:.3f} {ratio.ratio:6.1f}x "
              f"[{ratio.low:5.1f}, {ratio.high:5.1f}] {100 * (ppl / base_ppl - 1):+10.2f} %")
        rows[name] = {"rate": ratio.rate, "base_rate": ratio.base_rate, "ratio": ratio.ratio,
                      "ci": [ratio.low, ratio.high], "perplexity": ppl,
                      "perplexity_change_pct": 100 * (ppl / base_ppl - 1),
                      "routed": float(np.mean([r[name]["routed"] for r in per_seed]))}
    served = np.concatenate([c["instant_served_s"] for c in costs]) * 1e3
    hook = np.concatenate([c["instant_hook_s"] for c in costs]) * 1e3
    updates = np.concatenate([c["update_s"] for c in costs])
    summary = {"instant_served_p99_ms": float(np.percentile(served, 99)),
               "instant_hook_p99_ms": float(np.percentile(hook, 99)), "instant_calls": int(served.size),
               "update_s_median": float(np.median(updates)), "update_s_max": float(updates.max()),
               "adapter_bytes": costs[0]["adapter_bytes"], **extra}
    print(f"\nrouted by the pattern bank: {rows['SONA']['routed']:.0%} of held-out prompts; general text "
          f"routed in {sum(r['SONA']['general_routed'] for r in per_seed)} of {len(per_seed)} seeds "
          "(its perplexity above is measured with the adapter applied, routed or not)")
    print(f"instant loop: p99 {summary['instant_served_p99_ms']:.3f} ms per finished request on the serving "
          f"path ({summary['instant_calls']} requests; the hook body alone "
          f"{summary['instant_hook_p99_ms']:.3f} ms)")
    print(f"background loop: {summary['update_s_median']:.1f} s per update (median; max "
          f"{summary['update_s_max']:.1f} s)")
    b = summary["adapter_bytes"]
    print(f"adapter memory per tenant: served {b['served'] / 1024:.0f} KiB, training state "
          f"{b['training'] / 1024:.0f} KiB")
    if "throughput" in extra:
        t = extra["throughput"]
        print(f"serving throughput at C={t['concurrency']} ({t['requests']} requests a window): "
              f"{t['frozen_tok_s']:.1f} tok/s not learning; learning with updates deferred while busy "
              f"{t['deferred_tok_s']:.1f} tok/s ({t['deferred_tok_s'] / t['frozen_tok_s']:.2f}x, "
              f"{t['deferred_updates']} updates); updates beside serving {t['concurrent_tok_s']:.1f} tok/s "
              f"({t['concurrent_tok_s'] / t['frozen_tok_s']:.2f}x, {t['concurrent_updates']} updates)")
        print("inter-token latency p99 (engine histogram bucket): "
              + ", ".join(f"{label} {t[f'{key}_itl_p99_ms']:.0f} ms" for key, label in WINDOWS.items()))
    print(f"reset restores the base greedy output exactly: {'yes' if extra['reset_exact'] else 'NO'}")
    return {"rows": rows, **summary}


def parser() -> argparse.ArgumentParser:
    """The benchmark's settings (sona_dev.py parses the same ones, to choose among them)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-round", type=int, default=32, help="training prompts served per round")
    ap.add_argument("--train-topics", choices=TOPIC_KINDS, default="everyday",
                    help="everyday topics, or everyday and science/technology/history (sona_task.py)")
    ap.add_argument("--eval-topics", type=int, default=8, help="held-out topics per seed (x 4 questions)")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS,
                    help="the task's length limit: an answer that ends by itself within it is short")
    ap.add_argument("--miss-score", type=float, default=0.0, help="score of an answer that is not short")
    # The training settings default to SonaOptions' own, so the benchmark measures what
    # `[sona] enabled = true` gives a user.
    d = SonaOptions()
    ap.add_argument("--rank", type=int, default=d.rank)
    ap.add_argument("--alpha", type=float, default=d.alpha)
    ap.add_argument("--lr", type=float, default=d.learning_rate)
    ap.add_argument("--steps", type=int, default=d.steps_per_update)
    ap.add_argument("--batch", type=int, default=d.batch_size)
    ap.add_argument("--layers", type=int, default=d.layers)
    ap.add_argument("--targets", nargs="+", default=list(d.targets), help="modules the adapter trains")
    ap.add_argument("--max-seq-len", type=int, default=d.max_seq_len)
    ap.add_argument("--fisher-batch", type=int, default=d.fisher_batch)
    ap.add_argument("--ewc-lambda", type=lambda v: v if v == "auto" else float(v), default=d.ewc_lambda,
                    help='"auto" (per training dtype) or a number; chosen on sona_dev.py\'s dev topics '
                         "(docs/sona.md says how)")
    ap.add_argument("--route-threshold", type=float, default=d.route_threshold)
    ap.add_argument("--background-priority", type=lambda v: v if v == "idle" else int(v),
                    default=d.background_priority,
                    help='"idle" or a niceness 0-19 for updates beside serving (the throughput windows)')
    ap.add_argument("--no-deep", dest="deep", action="store_false", help="SONA without its deep loop")
    ap.add_argument("--offline-epochs", type=int, default=2)
    ap.add_argument("--ablate-deep", action="store_true", help="also SONA without its deep loop (replayed)")
    ap.add_argument("--throughput-requests", type=int, default=160,
                    help="requests a window (three windows); 0: skip the throughput check")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--plot", help="also draw them here (PNG; sona_plot.py draws several runs together)")
    return ap


def main() -> None:
    args = parser().parse_args()

    clock = Clock()
    backend = CandleLikeBackend.load(ModelSource.from_path(embedded_model_path()),
                                     {"dtype": "auto", "kv_cache_tokens": 16384})
    print(machine_line())
    learning = sona_options(args, 0)
    trained_in = training_dtype(learning.dtype, backend.model)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}; candle_like "
          f"{str(backend.dtype).removeprefix('torch.')}; model {backend.info.name}; SONA trains in "
          f"{str(trained_in).removeprefix('torch.')}, EWC++ lambda "
          f"{learning.ewc_strength(trained_in):g} ({args.ewc_lambda})")
    train_prompts = [chat_ids(backend, q) for q in questions(train_topics(args.train_topics))]
    general_ids = backend.tokenizer.encode(GENERAL_TEXT)
    print(f"task: short answers (end within {args.max_tokens} tokens); {args.seeds} seeds x {args.rounds} "
          f"rounds x {args.per_round} of {len(train_prompts)} training prompts; held-out {args.eval_topics} "
          f"of {len(HELD_OUT_TOPICS)} other topics x 4 questions x 1 sample per seed", flush=True)
    # No prefix cache: the reset check compares greedy outputs whose prefill shapes must match.
    opts = EngineOptions(max_num_seqs=16, block_size=16, enable_prefix_caching=False, max_queue=1024)
    per_seed, costs = [], []
    with ServingEngine(backend, opts) as engine:
        base_greedy = greedy(engine, backend)
        base_ppl = perplexity(backend.model, general_ids, None)
        sona = None
        for seed in range(args.seeds):
            # Each seed its share of the held-out topics, in turn: the seeds together cover them all.
            topics = [HELD_OUT_TOPICS[(seed * args.eval_topics + i) % len(HELD_OUT_TOPICS)]
                      for i in range(args.eval_topics)]
            eval_prompts = [chat_ids(backend, q) for q in questions(tuple(topics))]
            instructed = [chat_ids(backend, q) for q in questions(tuple(topics), instructed=True)]
            res, cost, sona = one_seed(engine, backend, args, seed, train_prompts, eval_prompts, instructed,
                                       general_ids, clock)
            per_seed.append(res)
            costs.append(cost)
            if seed < args.seeds - 1:
                sona.reset()
        extra: dict = {}
        if args.throughput_requests:
            clock.say("throughput at C=16, learning vs not")
            extra["throughput"] = throughput(engine, sona_options(args, 0), train_prompts,
                                             args.throughput_requests, max_tokens=args.max_tokens)
        sona.reset()
        extra["reset_exact"] = greedy(engine, backend) == base_greedy
    out = table(per_seed, base_ppl, costs, extra)
    clock.say("done")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "base_perplexity": base_ppl, **out}, fh, indent=2, default=str)
    if args.plot:
        print(plot([(f"candle_like {str(backend.dtype).removeprefix('torch.')}", out)], Path(args.plot)))


if __name__ == "__main__":
    main()
