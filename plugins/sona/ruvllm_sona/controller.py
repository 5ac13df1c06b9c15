"""``Sona``: the three learning loops bound to one ServingEngine on the candle_like backend.

- instant (:meth:`Sona.on_finished`, model thread): record the trajectory; microseconds.
- background (:meth:`Sona.background_step`, its own thread every ``interval`` seconds, or on
  demand): reward-weighted (un)likelihood steps on rated responses, with EWC++, then publish
  the new adapter through ``engine.publish`` (between two engine steps).
- deep (:meth:`Sona.deep`, after ``deep_every`` feedbacks or on demand): fold the MicroLoRA
  into the rank-``base_rank`` base LoRA, cluster the well-rated prompts' embeddings into
  patterns that point at a snapshot of that adapter, and restart the MicroLoRA.

Tenants learn apart. A request's tenant (``GenerationParams.tenant``: the server's ``user``) picks
its :class:`~ruvllm_sona.learner.Learner`, and feedback on that request trains only it: requests
without a tenant share the adapter ``adapter_name``, tenant ``t`` has ``<adapter_name>-t<hash of t>``,
and a tenant nothing was learned for runs the base model. The served adapter is always ``base LoRA
+ MicroLoRA`` (stacked exactly). :meth:`reset` forgets everything and unloads every SONA adapter,
:meth:`reset_tenant` one tenant's, so those requests run the base model again, bit for bit.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ruvllm.errors import BackendUnavailable, InvalidRequest
from ruvllm.serving import PluginMetric
from ruvllm.types import Trajectory

from ruvllm_sona.learner import Learner, unload
from ruvllm_sona.options import SonaOptions
from ruvllm_sona.store import TrajectoryStore
from ruvllm_sona.totals import SonaTotals
from ruvllm_sona.trainer import training_dtype

log = logging.getLogger(__name__)


class Sona:
    def __init__(self, engine: Any, options: SonaOptions | None = None, totals: SonaTotals | None = None):
        self.engine = engine
        self.options = opts = options or SonaOptions()
        backend = engine.backend
        for needed in ("publish_adapter", "unload_adapter", "embed", "model"):
            if not hasattr(backend, needed):
                raise BackendUnavailable(backend.name, "SONA trains a LoRA through the model's forward pass: "
                                         "it needs the candle_like backend (lora + embeddings)")
        self.backend = backend
        #: The model training runs through: the served one, or its copy in the training dtype
        #: (e.g. float32 beside a bf16 model on a CPU without native bf16), shared by all tenants.
        self.model = backend.model.cast(training_dtype(opts.dtype, backend.model))
        if self.model is not backend.model:
            log.info("SONA trains in %s on a copy of the %s model's weights", self.model.dtype,
                     backend.model.dtype)
        torch.manual_seed(opts.seed)
        self.store = TrajectoryStore(opts.capacity)
        self.frozen = False
        #: Background updates, deep runs and resets so far (any tenant's).
        self.version = 0
        #: What SONA has done on this engine, for its metrics (:meth:`metrics`); an earlier
        #: binding's when attached again, so the counters never go back.
        self.totals = totals or SonaTotals()
        self.last_stats: dict[str, float] = {}
        #: Seconds per instant-loop call (the serving-path cost), most recent first out.
        self.instant_seconds: collections.deque[float] = collections.deque(maxlen=100_000)
        self._learners: dict[str | None, Learner] = {}
        self._train_lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ tenants

    def adapter_name(self, tenant: str | None = None) -> str:
        """The adapter ``tenant`` learns into: ``adapter_name`` without a tenant, else a name from a
        hash of the tenant (user ids never reach adapter listings or files)."""
        if tenant is None:
            return self.options.adapter_name
        return f"{self.options.adapter_name}-t{hashlib.sha256(tenant.encode()).hexdigest()[:16]}"

    def learner(self, tenant: str | None = None) -> Learner:
        """``tenant``'s learning state, created on first use."""
        with self._train_lock:
            if tenant not in self._learners:
                name = self.adapter_name(tenant)
                self._learners[tenant] = Learner(self.engine, self.model, self.options, name)
            return self._learners[tenant]

    def _records(self, tenant: str | None) -> list:
        return [r for r in self.store.snapshot() if r.trajectory.tenant == tenant]

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
        self._lower_priority()
        due_since: float | None = None
        while not self._stop.wait(self.options.interval):
            try:
                if len(self.store.pending_feedback()) < self.options.min_feedback:
                    due_since = None
                else:
                    due_since = due_since or time.monotonic()
                    if not self._serving() or time.monotonic() - due_since >= self.options.defer_while_busy:
                        self.background_step()
                        due_since = None
                # Consolidate only once the due update has run, so the scores it waited for
                # are in what the deep loop folds (the order the benchmark measures).
                every = self.options.deep_every
                if every and self.store.feedback_since_deep >= every and due_since is None:
                    for tenant in list(self._learners):
                        self.deep("feedback", tenant=tenant)
            except Exception as exc:
                if getattr(self.engine, "_closed", False):
                    return
                log.exception("SONA background loop failed: %s", exc)

    def _lower_priority(self) -> None:
        """Give this thread (and the OpenMP workers its training spawns, which inherit it) the
        scheduling ``background_priority`` asks for: an update beside serving then runs on the
        CPU time serving leaves, instead of taking a core from every engine step."""
        priority = self.options.background_priority
        if priority == 0:
            return
        if not sys.platform.startswith("linux"):
            log.warning("sona.background_priority = %r needs Linux (per-thread scheduling): SONA's "
                        "background loop trains at serving's priority here", priority)
            return
        tid = threading.get_native_id()
        if priority == "idle":
            try:
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                return
            except OSError as exc:  # a sandbox may forbid the call; niceness is the next best
                log.warning("sona.background_priority = 'idle': SCHED_IDLE refused (%s); training at "
                            "niceness 19 instead", exc)
                priority = 19
        # Never above the priority this thread inherited (raising priority needs privileges).
        os.setpriority(os.PRIO_PROCESS, tid, max(priority, os.getpriority(os.PRIO_PROCESS, tid)))

    def _serving(self) -> bool:
        """Whether the engine has requests running or waiting (a due update then waits for it)."""
        metrics = self.engine.metrics()
        return metrics.running + metrics.waiting > 0

    # ------------------------------------------------------------------ instant loop

    def on_finished(self, trajectory: Trajectory) -> None:
        start = time.perf_counter()
        self.store.record(trajectory)
        self.instant_seconds.append(time.perf_counter() - start)

    def feedback(self, request_id: str, score: float) -> bool:
        recorded = self.store.feedback(request_id, score)
        if recorded:
            self.totals.add(feedback=1)
        return recorded

    def instant_p99(self) -> float:
        """99th percentile of the instant loop's cost, in seconds (0 before any request)."""
        times = list(self.instant_seconds)
        return float(np.percentile(times, 99)) if times else 0.0

    def metrics(self) -> list[PluginMetric]:
        """What SONA has done on this engine, for ``/metrics``: whether it learns and what that
        costs, without reading logs. Counts only, so Ray replicas' figures add up; the totals
        outlive a reset (which forgets what was learned, not what was done)."""
        def counter(name: str, help_: str, value: float) -> PluginMetric:
            return PluginMetric(name=f"sona_{name}_total", help=help_, kind="counter", value=value)

        def gauge(name: str, help_: str, value: float) -> PluginMetric:
            return PluginMetric(name=f"sona_{name}", help=help_, kind="gauge", value=value)

        t = self.totals
        return [
            counter("feedback", "Scores received for requests SONA recorded.", t.feedback),
            counter("updates", "Background-loop updates run (one per tenant with new scores).", t.updates),
            counter("update_seconds", "Seconds spent in background-loop updates.", t.update_seconds),
            counter("consolidations", "Deep-loop consolidations run.", t.consolidations),
            gauge("scores_waiting", "Scores not yet trained on.", len(self.store.pending_feedback())),
            gauge("requests_stored", "Finished requests held for feedback (at most sona.capacity).",
                  len(self.store)),
            gauge("tenants", "Tenants with learned state (requests without a tenant count as one).",
                  len(self._learners)),
        ]

    # ------------------------------------------------------------------ routing

    def select_adapter(self, prompt_ids: tuple[int, ...], tenant: str | None = None) -> str | None:
        """The adapter a request of ``tenant`` runs with: its own learner's, or None (the base
        model) when nothing was learned for it. Never another tenant's."""
        learner = self._learners.get(tenant)
        return None if learner is None else learner.select(prompt_ids)

    # ------------------------------------------------------------------ background loop

    def background_step(self) -> dict[str, float] | None:
        """Train each tenant with new feedback on its own records and publish its adapter; the
        stats of the last update, or None when there was nothing to learn (or learning is frozen)."""
        if self.frozen:
            return None
        with self._train_lock:
            pending = self.store.pending_feedback()
            by_tenant: dict[str | None, list] = {}
            for r in pending:
                by_tenant.setdefault(r.trajectory.tenant, []).append(r)
            stats = None
            for tenant, records in by_tenant.items():
                done = self.learner(tenant).train(records, self._records(tenant))
                for r in records:
                    r.trained = True
                if done is not None:
                    stats = self.last_stats = done
                    self.version += 1
                    self.totals.add(updates=1, update_seconds=done["seconds"])
            return stats

    # ------------------------------------------------------------------ deep loop

    def deep(self, reason: str = "on demand", *, tenant: str | None = None) -> dict[str, Any]:
        """Consolidate ``tenant``'s MicroLoRA into its base LoRA and store its learned patterns."""
        with self._train_lock:
            out = self.learner(tenant).deep(self._records(tenant))
            self.store.feedback_since_deep = 0
            self.version += 1
            self.totals.add(consolidations=1)
            log.info("SONA deep loop (%s): base LoRA rank %d, %d pattern(s)", reason, self.options.base_rank,
                     out["patterns"])
            return {"reason": reason, **out}

    # ------------------------------------------------------------------ switches

    def freeze(self, frozen: bool = True) -> None:
        """Stop (or resume) learning; the served adapters stay as they are."""
        self.frozen = frozen

    def reset(self) -> None:
        """Forget everything learned, for every tenant, and unload SONA's adapters: the base model
        serves again."""
        with self._train_lock:
            for learner in self._learners.values():
                learner.reset()
            self._learners.clear()
            # And what an earlier SONA on this engine left under these names (attach replaces it).
            name = self.options.adapter_name
            unload(self.engine, {n for n in self.backend.adapter_names()
                                 if n == name or n.startswith((name + "-p", name + "-t"))})
            self.store.clear()
            self.version += 1

    def reset_tenant(self, tenant: str | None) -> None:
        """Forget what ``tenant`` taught (its adapters and its stored requests); others keep theirs."""
        with self._train_lock:
            learner = self._learners.pop(tenant, None)
            if learner is not None:
                learner.reset()
            self.store.forget(tenant)
            self.version += 1

    # ------------------------------------------------------------------ PEFT files

    def save(self, directory: str | Path | None = None, *, tenant: str | None = None) -> Path:
        """Write ``tenant``'s served adapter (base + MicroLoRA) as a PEFT LoRA directory."""
        target = directory or self.options.save_dir
        if target is None:
            raise InvalidRequest("directory", "give a directory or set [sona] save_dir")
        return self.learner(tenant).save(target)

    def load(self, directory: str | Path, *, tenant: str | None = None) -> None:
        """Start ``tenant`` from a saved PEFT adapter (as its base LoRA) and publish it."""
        with self._train_lock:
            self.learner(tenant).load(directory)
