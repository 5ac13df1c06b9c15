"""How many CPU threads mistral.rs computes with, decided before its first Runner exists.

mistral.rs's CPU kernels (candle) run on a pool sized once per process from ``CANDLE_NUM_THREADS``,
else ``RAYON_NUM_THREADS``, else the machine's cores, ignoring the process's affinity mask. The
pool's caller spin-waits (without yielding) for its workers, so a process allowed fewer CPUs than
that (``taskset``, a container's cpuset, a pinned test worker) spins against the very thread it
waits for: pinned to one CPU with the default two threads, one stream ran at 1.2 tok/s vs 8.7
with one thread (measured with 0.9.5, 11 tokens of the embedded model). So the backend sizes the
pool from the CPUs the process may use, like llama.cpp's ``n_threads``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ruvllm.hardware import usable_cpus

#: Read by mistral.rs (candle's barrier pool first, then rayon) when its first model loads.
THREAD_VARIABLES = ("CANDLE_NUM_THREADS", "RAYON_NUM_THREADS")

#: What the process's first load chose: mistral.rs's pool keeps that size for the process.
_first: tuple[int, str] | None = None


def configure_threads(requested: int | None) -> tuple[int, str]:
    """Set mistral.rs's compute threads for this process; return (threads, where it came from).

    The backend option wins; else a value the user exported in either variable is kept (the pool
    reads ``CANDLE_NUM_THREADS`` first); else the CPUs in the affinity mask. Only the process's
    first load counts: mistral.rs builds its pool once, and later loads are told so.
    """
    global _first
    if _first is not None:
        threads, source = _first
        if requested not in (None, threads):
            return threads, f"{source}; fixed by the process's first mistral.rs load, not {requested}"
        return _first
    _first = choose_threads(requested, os.environ, usable_cpus())
    for name in THREAD_VARIABLES:
        os.environ[name] = str(_first[0])
    return _first


def choose_threads(requested: int | None, environ: Mapping[str, str], usable: int) -> tuple[int, str]:
    """(threads, why): the option, else an exported variable (in the order mistral.rs reads
    them), else ``usable`` CPUs."""
    if requested is not None:
        return requested, "backend option threads"
    for name in THREAD_VARIABLES:
        value = environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value), f"{name} from the environment"
    return usable, "the CPUs this process may run on"
