"""What ``backend = "auto"`` picks once it has measured this machine (``ruvllm tune``).

Which engine serves fastest depends on the CPU and on the load, in ways a fixed order cannot
know: on a 2-core AVX-512 + bf16 EPYC, candle_like (bf16) served 16 streaming clients 2.1x
faster than llama.cpp, while llama.cpp was 1.9x faster for one client; on a CPU without native
bf16 candle_like computes in float32 and the order differs again. So ``ruvllm tune`` measures
every installed backend on a model at a few client counts and records the figures for this
machine and model, and ``auto`` ranks backends by the measured throughput at the load it is
built for: the serving engine's ``max_num_seqs``, one client for :class:`ruvllm.LLM`. Without a
record that matches this machine (CPU, its features, the cores this process may use) and this
model file, the fixed preference order applies, and the log line says which one decided.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from ruvllm.hardware import CpuInfo, cpu_info
from ruvllm.models import ModelSource

log = logging.getLogger(__name__)

#: Under ``cache_dir``: one JSON record per model.
RECORDS_DIR = "auto-backend"
FORMAT_VERSION = 1


@attrs.frozen
class Measurement:
    backend: str
    clients: int
    output_tok_s: float


@attrs.frozen
class Preference:
    """The order ``auto`` tries backends in, and why (for the log line)."""

    order: tuple[str, ...]
    why: str


@attrs.frozen(kw_only=True)
class AutoRecord:
    """``ruvllm tune``'s figures for one model on one machine."""

    machine: str
    model: str
    measured_at: str
    measurements: tuple[Measurement, ...] = attrs.field(converter=tuple)

    def measured_at_load(self, load: int) -> tuple[tuple[Measurement, ...], int]:
        """The measurements at the client count nearest ``load`` (on a log scale: 12 clients are
        nearer 16 than 4), fastest first, and that client count."""
        counts = sorted({m.clients for m in self.measurements})
        if not counts:
            return (), 0
        nearest = min(counts, key=lambda c: (abs(math.log(c) - math.log(max(load, 1))), -c))
        at = sorted((m for m in self.measurements if m.clients == nearest), key=lambda m: -m.output_tok_s)
        return tuple(at), nearest

    def ranking(self, load: int) -> tuple[tuple[str, ...], int]:
        """Backends by measured throughput for ``load`` clients, fastest first, and the client
        count measured (see :meth:`measured_at_load`)."""
        at, clients = self.measured_at_load(load)
        return tuple(m.backend for m in at), clients

    def preference(self, load: int, fallback: Sequence[str]) -> Preference:
        at, clients = self.measured_at_load(load)
        ranked = tuple(m.backend for m in at)
        figures = ", ".join(f"{m.backend} {m.output_tok_s:.1f} tok/s" for m in at)
        order = ranked + tuple(b for b in fallback if b not in ranked)
        return Preference(order, f"measured by `ruvllm tune` on this machine ({self.measured_at}) at "
                                 f"{clients} client(s), the nearest to a load of {load}: {figures}")

    def to_json(self) -> str:
        return json.dumps({"version": FORMAT_VERSION, **attrs.asdict(self)}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> AutoRecord:
        data = json.loads(text)
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"record format {data.get('version')!r}, expected {FORMAT_VERSION}")
        return cls(machine=data["machine"], model=data["model"], measured_at=data["measured_at"],
                   measurements=[Measurement(**m) for m in data["measurements"]])


def machine_key(cpu: CpuInfo | None = None) -> str:
    """What makes figures from one machine apply to another: the CPU, its features, and the
    cores this process may use (a run pinned to one core is another machine for this)."""
    cpu = cpu or cpu_info()
    return f"{cpu.arch} | {cpu.model} | {' '.join(sorted(cpu.features))} | {cpu.usable_cores} cores"


def model_key(model: ModelSource) -> str:
    """The model file (or directory) by name and size: a re-quantised file is another model."""
    path = Path(model.path)
    files = [path] if path.is_file() else [p for p in path.glob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    return f"{path.name} ({size} bytes)"


def record_path(cache_dir: Path, model: ModelSource) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_key(model))
    return Path(cache_dir) / RECORDS_DIR / f"{safe}.json"


def save_record(cache_dir: Path, model: ModelSource, measurements: Sequence[Measurement]) -> AutoRecord:
    """Record ``measurements`` as this machine's figures for ``model`` (at :func:`record_path`)."""
    record = AutoRecord(machine=machine_key(), model=model_key(model),
                        measured_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                        measurements=measurements)
    path = record_path(cache_dir, model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(record.to_json())
    return record


def load_record(cache_dir: Path, model: ModelSource) -> AutoRecord | None:
    """This machine's record for ``model``; None when there is none or it is for another machine
    (a shared or copied cache directory) or unreadable, each logged with what to do."""
    path = record_path(cache_dir, model)
    if not path.is_file():
        return None
    try:
        record = AutoRecord.from_json(path.read_text())
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring %s (%s): run `ruvllm tune` again to measure this machine", path, exc)
        return None
    if record.machine != machine_key():
        log.info("ignoring %s: it was measured on another machine (%s); `ruvllm tune` measures this one",
                 path, record.machine)
        return None
    return record


def measured_preference(cache_dir: Path, model: ModelSource, load: int,
                        fallback: Sequence[str]) -> Preference | None:
    record = load_record(cache_dir, model)
    return None if record is None else record.preference(load, fallback)
