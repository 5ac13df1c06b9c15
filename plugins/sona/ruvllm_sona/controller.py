"""``Sona``: the three learning loops bound to one ServingEngine on the candle_like backend.

- instant (:meth:`Sona.on_finished`, model thread): record the trajectory; microseconds.
- background (:meth:`Sona.background_step`, its own thread every ``interval`` seconds, or on
  demand): reward-weighted (un)likelihood steps on rated responses, with EWC++, then publish
  the new adapter through ``engine.publish`` (between two engine steps).
- deep (:meth:`Sona.deep`, after ``deep_every`` feedbacks or on demand): fold the MicroLoRA
  into the rank-``base_rank`` base LoRA, cluster the well-rated prompts' embeddings into
  patterns that point at a snapshot of that adapter, and restart the MicroLoRA.

The served adapter is always ``base LoRA + MicroLoRA`` (stacked exactly), published under
``adapter_name``. :meth:`reset` forgets everything and unloads every SONA adapter, so the
model is the base model again, bit for bit.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ruvllm.errors import BackendUnavailable, InvalidRequest
from ruvllm.types import Trajectory
from ruvllm_candle_like.lora import LoraAdapter, load_peft

from ruvllm_sona.ewc import EwcPlusPlus
from ruvllm_sona.micro_lora import MicroLora, Pairs, combine, to_adapter, truncate
from ruvllm_sona.options import SonaOptions
from ruvllm_sona.patterns import Pattern, PatternBank, kmeans
from ruvllm_sona.store import Record, TrajectoryStore
from ruvllm_sona.trainer import Example, reward_loss, token_logprobs, training_dtype

log = logging.getLogger(__name__)

#: Prompt tokens used for routing and pattern embeddings (the head of the prompt).
EMBED_TOKENS = 128


class Sona:
    def __init__(self, engine: Any, options: SonaOptions | None = None):
        self.engine = engine
        self.options = opts = options or SonaOptions()
        backend = engine.backend
        for needed in ("publish_adapter", "unload_adapter", "embed", "model"):
            if not hasattr(backend, needed):
                raise BackendUnavailable(backend.name, "SONA trains a LoRA through the model's forward pass: "
                                         "it needs the candle_like backend (lora + embeddings)")
        self.backend = backend
        #: The model training runs through: the served one, or its copy in the training dtype
        #: (e.g. float32 beside a bf16 model on a CPU without native bf16).
        self.model = backend.model.cast(training_dtype(opts.dtype, backend.model))
        if self.model is not backend.model:
            log.info("SONA trains in %s on a copy of the %s model's weights", self.model.dtype,
                     backend.model.dtype)
        self.cfg = self.model.cfg
        torch.manual_seed(opts.seed)
        self._rng = random.Random(opts.seed)
        self.store = TrajectoryStore(opts.capacity)
        self.bank = PatternBank(opts.route_threshold)
        self.frozen = False
        self.base_pairs: Pairs | None = None
        self.version = 0
        self.deep_runs = 0
        self.last_stats: dict[str, float] = {}
        #: Seconds per instant-loop call (the serving-path cost), most recent first out.
        self.instant_seconds: collections.deque[float] = collections.deque(maxlen=100_000)
        self._train_lock = threading.RLock()
        self._new_micro()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _new_micro(self) -> None:
        o = self.options
        self.micro = MicroLora(self.cfg, rank=o.rank, alpha=o.alpha, targets=o.targets, seed=o.seed)
        self.optimizer = torch.optim.Adam(self.micro.parameters(), lr=o.learning_rate)
        self.ewc = EwcPlusPlus(self.micro.parameters(), strength=o.ewc_lambda, decay=o.fisher_decay)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Sona:
        """Run the background loop on its own thread every ``interval`` seconds."""
        if self._thread is None and self.options.interval > 0:
            self._thread = threading.Thread(target=self._run, name="ruvllm-sona", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
        self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.options.interval):
            try:
                if len(self.store.pending_feedback()) >= self.options.min_feedback:
                    self.background_step()
                every = self.options.deep_every
                if every and self.store.feedback_since_deep >= every:
                    self.deep("feedback")
            except Exception as exc:
                if getattr(self.engine, "_closed", False):
                    return
                log.exception("SONA background loop failed: %s", exc)

    # ------------------------------------------------------------------ instant loop

    def on_finished(self, trajectory: Trajectory) -> None:
        start = time.perf_counter()
        self.store.record(trajectory)
        self.instant_seconds.append(time.perf_counter() - start)

    def feedback(self, request_id: str, score: float) -> bool:
        return self.store.feedback(request_id, score)

    def instant_p99(self) -> float:
        """99th percentile of the instant loop's cost, in seconds (0 before any request)."""
        times = list(self.instant_seconds)
        return float(np.percentile(times, 99)) if times else 0.0

    # ------------------------------------------------------------------ routing

    @property
    def published(self) -> bool:
        return self.options.adapter_name in self.backend.adapter_names()

    def select_adapter(self, prompt_ids: tuple[int, ...]) -> str | None:
        mode = self.options.apply
        if mode == "explicit":
            return None
        if mode == "all":
            return self.options.adapter_name if self.published else None
        if not self.bank.patterns:
            return None
        return self.bank.route(self.backend.embed(prompt_ids[:EMBED_TOKENS]))

    # ------------------------------------------------------------------ background loop

    def _examples(self, records: list[Record]) -> list[Example]:
        return [Example(r.trajectory.prompt_ids, r.trajectory.output_ids, r.feedback or 0.0)
                for r in records if r.trajectory.output_ids]

    def background_step(self) -> dict[str, float] | None:
        """Train on buffered feedback and publish the new adapter; None when there was nothing
        to learn (or learning is frozen)."""
        if self.frozen:
            return None
        with self._train_lock:
            pending = self.store.pending_feedback()
            if not pending:
                return None
            o = self.options
            rated = [r for r in self.store.snapshot() if r.feedback is not None and r.feedback != 0]
            if not rated:
                for r in pending:
                    r.trained = True
                return None
            # Replay: each step mixes the new feedback with earlier rated responses.
            pool = rated[-4 * o.batch_size:]
            fresh = [r for r in pending if r.feedback]
            started = time.perf_counter()
            losses, penalties = [], []
            for _ in range(o.steps_per_update):
                batch = fresh[: o.batch_size]
                if len(batch) < o.batch_size:
                    rest = [r for r in pool if r not in batch]
                    batch += self._rng.sample(rest, min(len(rest), o.batch_size - len(batch)))
                loss, pen = self._train_step(self._examples(batch))
                losses.append(loss)
                penalties.append(pen)
                self._observe_fisher()
            for r in pending:
                r.trained = True
            self.publish()
            self.last_stats = {"loss": float(np.mean(losses)), "ewc_penalty": float(np.mean(penalties)),
                               "examples": float(len(fresh)), "seconds": time.perf_counter() - started,
                               "update_norm": self.micro.norm(), "version": float(self.version)}
            return self.last_stats

    def _train_step(self, examples: list[Example]) -> tuple[float, float]:
        weights = torch.tensor([e.weight for e in examples], dtype=torch.float32)
        logp, owners = token_logprobs(self.model, examples, self.micro.as_plan(self.model.dtype),
                                      self.options.max_seq_len)
        loss = reward_loss(logp.float(), owners, weights)
        pen = self.ewc.penalty()
        self.optimizer.zero_grad(set_to_none=True)
        (loss + pen).backward()
        torch.nn.utils.clip_grad_norm_(self.micro.parameters(), 1.0)
        self.optimizer.step()
        return loss.item(), pen.item()

    def _observe_fisher(self) -> None:
        """One Fisher estimate: squared gradients of the log-likelihood of served outputs (the
        model's own samples), a micro-batch of recent trajectories whatever their rating."""
        records = [r for r in self.store.snapshot() if r.trajectory.output_ids]
        if not records or self.options.ewc_lambda == 0:
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
        params = self.micro.parameters()
        grads = torch.autograd.grad(-logp.float().mean(), params, allow_unused=True)
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
        return to_adapter(name or self.options.adapter_name, self.cfg, self.current_pairs(),
                          dtype=served.dtype, device=served.device)

    def publish(self, adapter: LoraAdapter | None = None) -> None:
        """Swap the served adapter between two engine steps (waits until it is in place)."""
        adapter = adapter or self.current_adapter()
        self.engine.publish(lambda: self.backend.publish_adapter(adapter)).result()
        self.version += 1

    # ------------------------------------------------------------------ deep loop

    def deep(self, reason: str = "on demand") -> dict[str, Any]:
        """Consolidate MicroLoRA into the base LoRA and store the learned patterns."""
        with self._train_lock:
            o = self.options
            pairs = truncate(self.current_pairs(), o.base_rank)
            self.base_pairs = pairs
            self._new_micro()  # restart the MicroLoRA; the EWC++ anchor is its fresh start
            self.deep_runs += 1
            snapshot = f"{o.adapter_name}-p{self.deep_runs}"
            patterns = self._patterns(snapshot)
            if patterns:
                self.publish(self.current_adapter(snapshot))
                self.bank.add(patterns)
            self.publish()
            self.store.feedback_since_deep = 0
            log.info("SONA deep loop (%s): base LoRA rank %d, %d new pattern(s)", reason, o.base_rank,
                     len(patterns))
            return {"reason": reason, "patterns": len(patterns), "adapter": snapshot if patterns else None}

    def _patterns(self, adapter: str) -> list[Pattern]:
        good = [r for r in self.store.snapshot() if r.feedback is not None and r.feedback > 0]
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

    # ------------------------------------------------------------------ switches

    def freeze(self, frozen: bool = True) -> None:
        """Stop (or resume) learning; the served adapter stays as it is."""
        self.frozen = frozen

    def reset(self) -> None:
        """Forget everything learned and unload SONA's adapters: the base model serves again."""
        with self._train_lock:
            names = [n for n in self.backend.adapter_names()
                     if n == self.options.adapter_name or n.startswith(self.options.adapter_name + "-p")]

            def unload() -> None:
                for n in names:
                    self.backend.unload_adapter(n)

            self.engine.publish(unload).result()
            self.base_pairs = None
            self._new_micro()
            self.bank.clear()
            self.store.clear()
            self.version += 1

    # ------------------------------------------------------------------ PEFT files

    def save(self, directory: str | Path | None = None) -> Path:
        """Write the served adapter (base + MicroLoRA) as a PEFT LoRA directory."""
        target = directory or self.options.save_dir
        if target is None:
            raise InvalidRequest("directory", "give a directory or set [sona] save_dir")
        return self.current_adapter().save_peft(target, base_model=self.backend.info.name)

    def load(self, directory: str | Path) -> None:
        """Start from a saved PEFT adapter (as the base LoRA) and publish it."""
        with self._train_lock:
            adapter = load_peft(directory, self.options.adapter_name, self.cfg, dtype=torch.float32,
                                device=torch.device("cpu"))
            self.base_pairs = {k: (p.a.clone(), p.b * adapter.scale) for k, p in adapter.pairs.items()}
            self._new_micro()
            self.publish()
