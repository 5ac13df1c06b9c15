"""One adapter's learning: what SONA keeps per tenant.

A :class:`Learner` owns the MicroLoRA with its optimizer and EWC++, the consolidated base LoRA the
deep loop folds it into, and the pattern bank of the prompts it was rated well on. It trains only
on the records it is given and publishes only under its own adapter name (and that name's ``-pN``
snapshots), so one tenant's feedback never reaches another tenant's adapter.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ruvllm_candle_like.lora import LoraAdapter, load_peft

from ruvllm_sona.ewc import EwcPlusPlus
from ruvllm_sona.micro_lora import MicroLora, Pairs, combine, to_adapter, truncate
from ruvllm_sona.options import SonaOptions
from ruvllm_sona.patterns import Pattern, PatternBank, kmeans
from ruvllm_sona.store import Record
from ruvllm_sona.trainer import Example, token_logprobs, train_step

#: Prompt tokens used for routing and pattern embeddings (the head of the prompt).
EMBED_TOKENS = 128


class Learner:
    def __init__(self, engine: Any, model: Any, options: SonaOptions, name: str):
        """``model`` is the one training runs through (the served model or its copy in the training
        dtype); ``name`` the adapter this learner publishes."""
        self.engine = engine
        self.backend = engine.backend
        self.model = model
        self.cfg = model.cfg
        self.options = options
        self.name = name
        self._rng = random.Random(options.seed)
        self.bank = PatternBank(options.route_threshold)
        self.base_pairs: Pairs | None = None
        self.version = 0
        self.deep_runs = 0
        self.last_stats: dict[str, float] = {}
        self.new_micro()

    def new_micro(self, *, keep_fisher: bool = False) -> None:
        """A fresh MicroLoRA (a no-op) with its own optimizer, EWC++ anchored at its start; the
        running Fisher is kept when ``keep_fisher`` (after a consolidation), else restarted."""
        o = self.options
        self.micro = MicroLora(self.cfg, rank=o.rank, alpha=o.alpha, targets=o.targets, seed=o.seed,
                               layers=o.layers)
        self.optimizer = torch.optim.Adam(self.micro.parameters(), lr=o.learning_rate)
        if keep_fisher:
            self.ewc.rebase(self.micro.parameters())
        else:
            self.ewc = EwcPlusPlus(self.micro.parameters(), strength=o.ewc_strength(self.model.dtype),
                                   decay=o.fisher_decay)

    # ------------------------------------------------------------------ routing

    @property
    def published(self) -> bool:
        return self.name in self.backend.adapter_names()

    def select(self, prompt_ids: tuple[int, ...]) -> str | None:
        mode = self.options.apply
        if mode == "explicit":
            return None
        if mode == "all":
            return self.name if self.published else None
        if not self.bank.patterns:
            return None
        return self.bank.route(self.backend.embed(prompt_ids[:EMBED_TOKENS]))

    # ------------------------------------------------------------------ background loop

    def train(self, pending: list[Record], records: list[Record]) -> dict[str, float] | None:
        """Gradient steps on the ``pending`` feedback (each step filled up with earlier rated
        ``records``, replay), then publish; None when nothing rated non-zero is there.

        The steps run through the base model with the MicroLoRA alone, not through the
        consolidated base LoRA: each consolidation's increment learns from the base model and
        the base LoRA sums them. Training through the served model (base LoRA frozen beneath)
        was measured on the dev topics (docs/sona.md, 2026-12-01): from the same feedback it
        learned a fifth to a quarter less at the same forgetting, in bf16 and in float32."""
        o = self.options
        rated = [r for r in records if r.feedback]
        fresh = [r for r in pending if r.feedback]
        if not rated:
            return None
        pool = rated[-4 * o.batch_size:]
        started = time.perf_counter()
        losses, penalties = [], []
        for step in range(o.steps_per_update):
            # Steps walk through the fresh feedback, so a large update trains on all of it.
            first = (step * o.batch_size) % max(len(fresh), 1)
            batch = fresh[first:first + o.batch_size]
            if len(batch) < o.batch_size:
                rest = [r for r in pool if r not in batch]
                batch += self._rng.sample(rest, min(len(rest), o.batch_size - len(batch)))
            loss, pen = train_step(self.model, self.micro, self.optimizer, _examples(batch), o.max_seq_len,
                                   self.ewc.penalty)
            losses.append(loss)
            penalties.append(pen)
            self._observe_fisher(records)
        self.publish()
        self.last_stats = {"loss": float(np.mean(losses)), "ewc_penalty": float(np.mean(penalties)),
                           "examples": float(len(fresh)), "seconds": time.perf_counter() - started,
                           "update_norm": self.micro.norm(), "version": float(self.version)}
        return self.last_stats

    def _observe_fisher(self, records: list[Record]) -> None:
        """One Fisher estimate: squared gradients of the log-likelihood of served outputs (the
        model's own samples), a micro-batch of recent trajectories whatever their rating."""
        records = [r for r in records if r.trajectory.output_ids]
        if not records or self.ewc.strength == 0:
            return
        unseen = [r for r in records if not r.fisher_seen]
        pick = (unseen or records)[-self.options.fisher_batch:]
        if len(pick) < self.options.fisher_batch:
            pick += self._rng.sample(records, min(len(records), self.options.fisher_batch - len(pick)))
        for r in pick:
            r.fisher_seen = True
        examples = [Example(r.trajectory.prompt_ids, r.trajectory.output_ids) for r in pick]
        logp, _ = token_logprobs(self.model, examples, self.micro.as_plan(self.model.dtype),
                                 self.options.max_seq_len)
        grads = torch.autograd.grad(-logp.float().mean(), self.micro.parameters(), allow_unused=True)
        self.ewc.observe(list(grads))

    # ------------------------------------------------------------------ publishing

    def current_pairs(self) -> Pairs:
        """The served update, base LoRA + MicroLoRA, as scale-1 pairs."""
        parts = [self.micro.delta()]
        if self.base_pairs is not None:
            parts.insert(0, self.base_pairs)
        return combine(parts)

    def current_adapter(self, name: str | None = None) -> LoraAdapter:
        # Served by the backend's model, so in its dtype (not the training copy's).
        served = self.backend.model
        return to_adapter(name or self.name, self.cfg, self.current_pairs(), dtype=served.dtype,
                          device=served.device)

    def publish(self, adapter: LoraAdapter | None = None) -> None:
        """Swap the served adapter between two engine steps (waits until it is in place)."""
        adapter = adapter or self.current_adapter()
        self.engine.publish(lambda: self.backend.publish_adapter(adapter)).result()
        self.version += 1

    # ------------------------------------------------------------------ deep loop

    def deep(self, records: list[Record]) -> dict[str, Any]:
        """Consolidate MicroLoRA into the base LoRA and cluster the well-rated prompts of
        ``records`` into the pattern bank, every pattern pointing at the consolidated snapshot."""
        o = self.options
        self.base_pairs = truncate(self.current_pairs(), o.base_rank)
        # Restart the MicroLoRA: EWC++'s anchor becomes the consolidated model, its Fisher stays.
        self.new_micro(keep_fisher=True)
        self.deep_runs += 1
        snapshot = f"{self.name}-p{self.deep_runs}"
        patterns = self._patterns(records, snapshot)
        if patterns:
            # The new snapshot holds every earlier consolidation (the base LoRA accumulates), so
            # all patterns point at it and older snapshots go: a prompt routed to a stale one
            # would lose what was learned since, and each one holds memory.
            self.publish(self.current_adapter(snapshot))
            unload(self.engine, self.bank.replace(patterns) - {snapshot})
        self.publish()
        return {"patterns": len(patterns), "adapter": snapshot if patterns else None}

    def _patterns(self, records: list[Record], adapter: str) -> list[Pattern]:
        good = [r for r in records if r.feedback is not None and r.feedback > 0]
        if not good:
            return []
        for r in good:
            if r.embedding is None:
                r.embedding = self.backend.embed(r.trajectory.prompt_ids[:EMBED_TOKENS])
        points = np.stack([r.embedding for r in good])
        centroids, assign = kmeans(points, self.options.max_patterns, seed=self.options.seed)
        out = []
        for j, c in enumerate(centroids):
            members = [r for r, a in zip(good, assign, strict=True) if a == j]
            if members:
                out.append(Pattern(centroid=c, adapter=adapter, size=len(members),
                                   mean_score=float(np.mean([r.feedback for r in members]))))
        return out

    # ------------------------------------------------------------------ reset and files

    def reset(self) -> None:
        """Forget everything learned and unload this learner's adapters."""
        unload(self.engine, {n for n in self.backend.adapter_names()
                             if n == self.name or n.startswith(self.name + "-p")})
        self.base_pairs = None
        self.new_micro()
        self.bank.clear()
        self.version += 1

    def save(self, directory: str | Path) -> Path:
        """Write the served adapter (base + MicroLoRA) as a PEFT LoRA directory."""
        return self.current_adapter().save_peft(directory, base_model=self.backend.info.name)

    def load(self, directory: str | Path) -> None:
        """Start from a saved PEFT adapter (as the base LoRA) and publish it."""
        adapter = load_peft(directory, self.name, self.cfg, dtype=torch.float32, device=torch.device("cpu"))
        self.base_pairs = {k: (p.a.clone(), p.b * adapter.scale) for k, p in adapter.pairs.items()}
        self.new_micro()
        self.publish()


def unload(engine: Any, names: set[str]) -> None:
    """Unload adapters between two engine steps (running requests keep the object they hold)."""
    def drop() -> None:
        for n in names:
            engine.backend.unload_adapter(n)

    if names:
        engine.publish(drop).result()


def _examples(records: list[Record]) -> list[Example]:
    return [Example(r.trajectory.prompt_ids, r.trajectory.output_ids, r.feedback or 0.0)
            for r in records if r.trajectory.output_ids]
