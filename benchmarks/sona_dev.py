"""How sona_learning.py's settings were chosen, without looking at its held-out prompts.

Each setting (the task's length limit, EWC++ strength, learning rate) runs SONA online as the
benchmark does, but trains on 24 training topics and measures on 8 kept back (the dev topics: 4
everyday ones and 4 science/technology/history subjects, never a held-out one; see
``sona_task.train_topics``), and measures forgetting on VALIDATION_TEXTS (seven expository passages)
instead of GENERAL_TEXT: the drift over all of them, token-weighted, and the worst passage's.
Seeds 11 and up, not the benchmark's 0-4. The benchmark's other settings apply (``--rounds``,
``--per-round``, ``--train-topics``, ...).

    nice -n 10 .venv/bin/python benchmarks/sona_dev.py --settings 32:3e4 24:1e6 24:1e5:1e-2

A setting is ``TOKENS:LAMBDA[:LR]``; each takes about 1.5 min per seed on 2 quiet AVX2 cores
(3 rounds of 32 prompts).
"""

from __future__ import annotations

import argparse

import numpy as np
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.models import ModelSource
from ruvllm.registry import embedded_model_path
from ruvllm_candle_like.backend import CandleLikeBackend
from ruvllm_candle_like.lora import LoraPlan
from ruvllm_sona import detach
from ruvllm_sona.trainer import perplexity
from sona_learning import Clock, chat_ids, online, parser, serve, served_name
from sona_task import TEMPLATES, VALIDATION_TEXTS, dev_topics, is_short, questions, train_topics

#: Topics of each kind kept back from training to measure on.
DEV_TOPICS = 4


def setting(base: argparse.Namespace, text: str) -> argparse.Namespace:
    tokens, lam, *lr = text.split(":")
    return argparse.Namespace(**{**vars(base), "max_tokens": int(tokens), "ewc_lambda": float(lam),
                                 "lr": float(lr[0]) if lr else base.lr})


def answered_short(engine, prompts, seed: int, args, adapter=None) -> list[bool]:
    results = serve(engine, prompts, seed, args.temperature, [adapter] * len(prompts),
                    max_tokens=args.max_tokens)
    return [is_short(results[i][1], args.max_tokens) for i in range(len(prompts))]


def by_kind(hits: list[bool], kind: int) -> list[bool]:
    """One kind's share of the dev answers (0 everyday, 1 subjects), every seed: ``dev_topics``
    lists the everyday topics first, and each topic has one question per template."""
    per_kind = DEV_TOPICS * len(TEMPLATES)
    return [h for i, h in enumerate(hits) if (i // per_kind) % 2 == kind]


def log_perplexities(model, texts: list[list[int]], lora) -> np.ndarray:
    """Each text's log perplexity (each text read on its own, from its first token)."""
    return np.log([perplexity(model, ids, lora) for ids in texts])


def drifts(base: np.ndarray, adapted: np.ndarray, lengths: np.ndarray) -> tuple[float, float]:
    """Perplexity change in % over all texts (token-weighted) and in the worst text."""
    overall = np.exp(np.average(adapted - base, weights=lengths)) - 1
    return 100 * float(overall), 100 * float(np.exp(np.max(adapted - base)) - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", nargs="+", required=True, help="TOKENS:LAMBDA[:LR] each")
    ap.add_argument("--dev-seeds", type=int, nargs="+", default=[11, 12])
    own, rest = ap.parse_known_args()
    base = parser().parse_args(rest)

    backend = CandleLikeBackend.load(ModelSource.from_path(embedded_model_path()),
                                     {"dtype": "auto", "kv_cache_tokens": 16384})
    train = [chat_ids(backend, q) for q in questions(train_topics(base.train_topics, DEV_TOPICS))]
    dev = [chat_ids(backend, q) for q in questions(dev_topics(DEV_TOPICS))]
    validation = [backend.tokenizer.encode(text) for text in VALIDATION_TEXTS]
    lengths = np.array([len(ids) - 1 for ids in validation])
    clock = Clock()
    opts = EngineOptions(max_num_seqs=16, block_size=16, enable_prefix_caching=False, max_queue=1024)
    lines = []
    with ServingEngine(backend, opts) as engine:
        base_logppl = log_perplexities(backend.model, validation, None)
        for text in own.settings:
            args = setting(base, text)
            base_hits, hits, drift, worst, per_round = [], [], [], [], []
            for seed in own.dev_seeds:
                base_hits += answered_short(engine, dev, seed, args)
                sona, rounds, _ = online(engine, backend, args, seed, train, clock)
                detach(engine)
                name = served_name(sona)
                hits += answered_short(engine, dev, seed, args, name)
                lora = LoraPlan([(backend.adapters.get(name), None)])
                overall, text_worst = drifts(base_logppl, log_perplexities(backend.model, validation, lora),
                                             lengths)
                drift.append(overall)
                worst.append(text_worst)
                per_round.append([sum(score > 0 for _, score in events) for events in rounds])
                sona.reset()
            b, r = float(np.mean(base_hits)), float(np.mean(hits))
            kinds = " / ".join(f"{np.mean(by_kind(base_hits, k)):.3f} -> {np.mean(by_kind(hits, k)):.3f}"
                               for k in range(2))
            lines.append(f"{text:18} {b:9.3f} {r:9.3f} {r / b if b else float('inf'):6.2f}x "
                         f"{np.mean(drift):+8.2f} % ({', '.join(f'{d:+.1f}' for d in drift)})"
                         f" {np.mean(worst):+7.2f} %  {kinds:28}  {per_round}")
            clock.say(lines[-1])
    print(f"\n{'tokens:lambda[:lr]':18} {'dev base':>9} {'SONA':>9} {'ratio':>7} {'validation drift':>17}"
          f" {'worst text':>10}"
          f"  {'everyday / subject topics':28}  short training answers per round, per seed")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
