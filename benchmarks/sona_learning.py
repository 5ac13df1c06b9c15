"""SONA proof: the model learns a preferred behaviour from feedback while serving, without
forgetting what it knew.

Task (scored automatically): answers to "Write one short sentence about <topic>." that contain
a given word (default "ancient"). Each round serves the training prompts through the real
ServingEngine (sampling, batched), scores every answer (+1 with the word, ``--miss-score``
without), sends the scores through the feedback API (``engine.feedback``: the same path as
``POST /v1/feedback``), and runs SONA's background loop. Measured:

- the preferred behaviour's rate on held-out topics before and after (target >= 3x);
- perplexity on a held-out text before and after, with EWC++ and, in a second run from the
  same start, without it (the forgetting EWC++ prevents);
- the instant loop's cost on the serving path (p99, target < 1 ms), timed around the engine's
  call of the hook for every finished request while the engine serves;
- that reset restores the base model's greedy output exactly.

    .venv/bin/python benchmarks/sona_learning.py            # ~16 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from ruvllm.bench.machine import machine_line
from ruvllm.chat import render_chat
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.models import ModelSource
from ruvllm.registry import embedded_model_path
from ruvllm.types import GenerationParams
from ruvllm_candle_like.backend import CandleLikeBackend
from ruvllm_candle_like.lora import LoraPlan
from ruvllm_sona import SonaOptions, attach, detach
from ruvllm_sona.trainer import perplexity

#: Many topics, one sample each per round: with few topics sampled many times the adapter
#: learned those topics (training-prompt rate 3-4x) and little of it reached held-out topics.
TRAIN_TOPICS = ["the sea", "a cat", "coffee", "winter", "a city at night", "music", "a forest", "bread",
                "the moon", "trains", "a library", "rain", "a bridge", "horses", "a lighthouse", "cheese",
                "a castle", "the wind", "a violin", "apples", "a harbour", "clocks", "a village", "honey",
                "a museum", "the stars", "a road", "candles", "a lake", "dogs", "a temple", "spring",
                "a kite", "the ocean floor", "a farm", "maps", "a cave", "summer", "a ship", "owls",
                "a chair", "fire", "a valley", "books", "a well", "salt", "a tower", "the morning"]
EVAL_TOPICS = ["a garden", "the desert", "a market", "autumn", "a mountain", "tea", "a river", "birds",
               "a festival", "the sky", "a bakery", "snow"]
GREEDY_CHECK = ["The capital of France is", "Write one short sentence about a lighthouse.",
                "List three primary colors:"]
#: Held-out text for perplexity: plain expository prose, unlike the task's answers.
HELD_OUT = (
    "The water cycle describes how water moves between the oceans, the air and the land. Heat from "
    "the sun evaporates water from the surface of seas and lakes, and plants release water vapour "
    "through their leaves. As the warm, moist air rises it cools, and the vapour condenses into tiny "
    "droplets that form clouds. When the droplets grow heavy enough they fall as rain or snow. Some of "
    "this water runs off into rivers and flows back to the sea, some soaks into the ground and "
    "refills underground stores called aquifers, and some is taken up again by plants. The cycle has "
    "no beginning or end, and the total amount of water on Earth stays almost the same over time. "
    "Understanding it helps farmers plan irrigation, engineers design reservoirs, and scientists "
    "predict droughts and floods. A bicycle is a simple machine that turns the rider's pedalling into "
    "forward motion. The pedals turn a crank, the crank turns a toothed wheel, and a chain carries "
    "that motion to a smaller wheel fixed to the rear hub. Because the rear sprocket is smaller, each "
    "turn of the pedals turns the back wheel more than once. Gears let the rider choose between easy "
    "pedalling on hills and higher speed on flat roads. Brakes press pads against the rim or a disc to "
    "slow the wheel by friction, and the tyres, filled with air, absorb small bumps in the road."
)


def chat_ids(backend, text: str) -> list[int]:
    st = backend.info.special_tokens
    rendered = render_chat(backend.info.chat_template, [{"role": "user", "content": text}],
                           bos_token=st.bos_text, eos_token=st.eos_text)
    return backend.tokenizer.encode(rendered, add_special=False, parse_special=True)


def topic_prompts(backend, topics) -> list[list[int]]:
    return [chat_ids(backend, f"Write one short sentence about {t}.") for t in topics]


def sample(engine, prompts, seeds, max_tokens, temperature, adapter=None):
    handles = [(engine.submit_sync(p, GenerationParams(max_tokens=max_tokens, temperature=temperature,
                                                       seed=s, adapter=adapter)))
               for s in seeds for p in prompts]
    return [(h.request_id, h.result()) for h in handles]


def rate(results, word: str) -> float:
    return float(np.mean([word in r.text.lower() for _, r in results]))


def greedy(engine, backend, max_tokens=24):
    """Greedy tokens of each check prompt, one request at a time: a batch's composition depends
    on arrival timing, and bf16 results on the batch's shapes, so like is compared with like."""
    params = GenerationParams(max_tokens=max_tokens)
    return [list(engine.submit_sync(backend.tokenizer.encode(t), params).result().token_ids)
            for t in GREEDY_CHECK]


def run(engine, backend, args, *, ewc_lambda: float, label: str, held_out_ids, eval_prompts,
        train_prompts) -> dict:
    opts = SonaOptions(rank=args.rank, alpha=args.alpha, learning_rate=args.lr, steps_per_update=args.steps,
                       batch_size=args.batch, ewc_lambda=ewc_lambda, interval=0, seed=args.seed)
    sona = attach(engine, opts, start=False)
    served: list[float] = []
    original = engine._finished

    def timed(*a):  # the engine's whole serving-path cost of the instant loop, per request
        t = time.perf_counter()
        original(*a)
        served.append(time.perf_counter() - t)

    engine._finished = timed
    rounds = []
    try:
        for r in range(args.rounds):
            t0 = time.perf_counter()
            results = sample(engine, train_prompts, [1000 * (r + 1) + s for s in range(args.samples)],
                             args.max_tokens, args.temperature)
            hits = 0
            for rid, res in results:
                good = args.word in res.text.lower()
                hits += good
                engine.feedback(rid, 1.0 if good else args.miss_score)
            gen_s = time.perf_counter() - t0
            # The background loop, on demand (its thread runs the same step periodically).
            engine.hooks.ruvllm_step_idle(engine=engine)
            stats = sona.last_stats
            rounds.append({"round": r + 1, "train_rate": hits / len(results), "loss": stats.get("loss"),
                           "ewc_penalty": stats.get("ewc_penalty"), "serve_s": round(gen_s, 1),
                           "train_s": round(stats.get("seconds", 0.0), 1)})
            print(f"  [{label}] round {r + 1}: train-prompt rate {hits}/{len(results)}, loss "
                  f"{stats.get('loss', 0):.3f}, ewc {stats.get('ewc_penalty', 0):.4f}, serve {gen_s:.1f}s, "
                  f"train {stats.get('seconds', 0):.1f}s", flush=True)
        final = sample(engine, eval_prompts, range(args.eval_seeds), args.max_tokens, args.temperature)
        final_rate = rate(final, args.word)
        adapter = backend.adapters.get(opts.adapter_name)
        ppl = perplexity(backend.model, held_out_ids, LoraPlan([(adapter, None)]))
        p99_hook = float(np.percentile(sona.instant_seconds, 99))
        p99_served = float(np.percentile(served, 99))
        sona.reset()
        after_reset = greedy(engine, backend)
    finally:
        engine._finished = original
        detach(engine)
    return {"label": label, "ewc_lambda": ewc_lambda, "rounds": rounds, "final_rate": final_rate,
            "perplexity": ppl, "instant_p99_ms": p99_hook * 1e3, "instant_served_p99_ms": p99_served * 1e3,
            "instant_calls": len(served), "greedy_after_reset": after_reset}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--word", default="ancient")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--samples", type=int, default=1, help="samples per training prompt per round")
    ap.add_argument("--eval-seeds", type=int, default=48, help="samples per held-out prompt")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--miss-score", type=float, default=0.0, help="score of an answer without the word")
    ap.add_argument("--rank", type=int, default=2)
    ap.add_argument("--alpha", type=float, default=4.0)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ewc-lambda", type=float, default=3e4)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-no-ewc", action="store_true")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    torch.manual_seed(args.seed)

    started = time.perf_counter()
    backend = CandleLikeBackend.load(ModelSource.from_path(embedded_model_path()),
                                     {"dtype": args.dtype, "kv_cache_tokens": 8192})
    print(machine_line())
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}; backend candle_like "
          f"{args.dtype} ({str(backend.dtype).removeprefix('torch.')}); model {backend.info.name}")
    print(f"task: answers containing {args.word!r}; {args.rounds} rounds x {len(TRAIN_TOPICS)} prompts x "
          f"{args.samples} samples (T={args.temperature}); eval {len(EVAL_TOPICS)} held-out topics x "
          f"{args.eval_seeds} samples")
    train_prompts = topic_prompts(backend, TRAIN_TOPICS)
    eval_prompts = topic_prompts(backend, EVAL_TOPICS)
    held_out_ids = backend.tokenizer.encode(HELD_OUT)
    # No prefix cache: a cached prefix changes the shapes of the matmuls that compute the rest of
    # a prompt, and bf16 results depend on those shapes; the reset check compares like with like.
    # Each sampling wave is submitted at once: the queue must hold the largest one.
    largest_wave = max(len(EVAL_TOPICS) * args.eval_seeds, len(TRAIN_TOPICS) * args.samples)
    opts = EngineOptions(max_num_seqs=16, block_size=16, enable_prefix_caching=False,
                         max_queue=max(256, largest_wave))
    with ServingEngine(backend, opts) as engine:
        base_greedy = greedy(engine, backend)
        base_samples = sample(engine, eval_prompts, range(args.eval_seeds), args.max_tokens, args.temperature)
        base_rate = rate(base_samples, args.word)
        base_ppl = perplexity(backend.model, held_out_ids, None)
        print(f"base: rate {base_rate:.3f}, held-out perplexity {base_ppl:.3f}", flush=True)
        common = dict(held_out_ids=held_out_ids, eval_prompts=eval_prompts, train_prompts=train_prompts)
        runs = [run(engine, backend, args, ewc_lambda=args.ewc_lambda, label="EWC++", **common)]
        if not args.skip_no_ewc:
            runs.append(run(engine, backend, args, ewc_lambda=0.0, label="no EWC", **common))
    print()
    print(f"{'run':8} {'rate':>14} {'x base':>7} {'perplexity':>18} {'instant p99':>12} {'reset exact':>12}")
    for r in runs:
        ratio = r["final_rate"] / base_rate if base_rate else float("inf")
        dppl = 100 * (r["perplexity"] / base_ppl - 1)
        exact = r["greedy_after_reset"] == base_greedy
        print(f"{r['label']:8} {base_rate:.3f} -> {r['final_rate']:.3f} {ratio:6.1f}x "
              f"{base_ppl:7.3f} -> {r['perplexity']:7.3f} ({dppl:+.1f}%) "
              f"{r['instant_served_p99_ms']:9.3f} ms "
              f"{'yes' if exact else 'NO':>12}")
        r.update(rate_ratio=ratio, perplexity_change_pct=dppl, reset_exact=exact)
    first = runs[0]
    print(f"instant loop: p99 {first['instant_served_p99_ms']:.3f} ms per finished request on the serving "
          f"path ({first['instant_calls']} requests; hook body alone p99 {first['instant_p99_ms']:.3f} ms)")
    print(f"total {time.perf_counter() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"base_rate": base_rate, "base_perplexity": base_ppl, "runs": runs,
                       "args": vars(args)}, fh, indent=2)


if __name__ == "__main__":
    main()
