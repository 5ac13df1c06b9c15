"""Run a backend's native code once in a throwaway child process before trusting it in this one.

A native library built for another CPU, or miscompiled for this one, does not raise: it kills
the process with a signal (llama.cpp's AMX build on an Intel Xeon dies with SIGILL at its first
tile instruction; a bad context parameter trips a ``GGML_ASSERT`` and aborts). Nothing a Python
``try`` can catch, and a user's first message would be "Illegal instruction". So a backend with
such code declares a :class:`NativeProbe`: a function that pushes one token through that code.
Before the backend is listed as available or selected, the probe runs in a child process; a
child killed by a signal makes the backend unavailable with a reason naming the signal, this
CPU's kind and the fix, and ``auto`` moves on to the next backend.

The outcome is cached on disk per backend build and machine (:func:`probe_key`), so the child
runs once per build and CPU (about a second), not once per command.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import attrs

from ruvllm.auto_backend import machine_key
from ruvllm.config import default_cache_dir
from ruvllm.errors import NativeProbeSkipped
from ruvllm.hardware import cpu_info

log = logging.getLogger(__name__)

#: Exit status of a child whose probe could not run here (no model to probe with, say): not a
#: verdict on the native code, so nothing is cached and the backend is not held back.
CANNOT_PROBE = 3
#: A probe loads a small model and decodes one token: seconds. A child still running after
#: this is stopped and the outcome is left open (a hung child is not a crash of this process).
TIMEOUT_S = 180.0
PROBES_DIR = "native-probe"


@attrs.frozen
class NativeProbe:
    """What a backend hands core to check its native code in a child process."""

    #: "package.module:function"; the function runs one token through the native code and
    #: returns (or raises :class:`~ruvllm.errors.NativeProbeSkipped` when it cannot run here).
    target: str
    #: What the library's behaviour depends on (version, the library file, how it was built):
    #: a new build is probed again.
    build_id: str
    #: Called with the signal number when the child died: what the user should do.
    fix: Callable[[int], str] = attrs.field(eq=False)


@attrs.frozen
class ProbeOutcome:
    ok: bool
    reason: str | None = None


def probe_key(backend: str, probe: NativeProbe) -> str:
    parts = [backend, probe.target, probe.build_id, machine_key()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def crash_reason(backend: str, probe: NativeProbe | None, cache_dir: Path | None = None) -> str | None:
    """Why ``backend``'s native code cannot run here (the child died), or None when it ran, it
    has no native probe, or the probe could not run."""
    if probe is None:
        return None
    return _outcome(backend, probe, Path(cache_dir or default_cache_dir())).reason


@functools.cache
def _outcome(backend: str, probe: NativeProbe, cache_dir: Path) -> ProbeOutcome:
    path = cache_dir / PROBES_DIR / f"{backend}-{probe_key(backend, probe)}.json"
    try:
        data = json.loads(path.read_text())
        return ProbeOutcome(ok=bool(data["ok"]), reason=data.get("reason"))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    outcome = run_probe(backend, probe)
    if outcome is None:
        return ProbeOutcome(ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(attrs.asdict(outcome)))
    partial.replace(path)  # atomic: two processes probing at once both write the same verdict
    return outcome


def run_probe(backend: str, probe: NativeProbe) -> ProbeOutcome | None:
    """Run the probe in a child; None when the child could not give a verdict."""
    log.info("checking that %s's native code runs on this CPU (a one-token decode in a child process)",
             backend)
    try:
        child = subprocess.run([sys.executable, "-m", "ruvllm.native_probe", probe.target],
                               capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        log.warning("%s's native probe did not finish in %.0f s; not judged", backend, TIMEOUT_S)
        return None
    if child.returncode == 0:
        return ProbeOutcome(ok=True)
    if child.returncode < 0:
        return ProbeOutcome(ok=False, reason=died_reason(backend, -child.returncode, child.stderr, probe.fix))
    last = (child.stderr.strip().splitlines() or ["no output"])[-1]
    if child.returncode != CANNOT_PROBE:
        log.warning("%s's native probe failed without a crash (exit %d: %s); not judged",
                    backend, child.returncode, last)
    return None


def died_reason(backend: str, signum: int, stderr: str, fix: Callable[[int], str]) -> str:
    """The reason shown for a backend whose native code died with ``signum``."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    said = [line.strip() for line in stderr.splitlines() if "GGML_ASSERT" in line or "error" in line.lower()]
    detail = f" ({said[-1][:200]})" if said else ""
    return (f"its native code died with {name} ({signal.strsignal(signum)}) on this CPU "
            f"[{cpu_info().kind_summary()}] when a child process decoded one token{detail}; {fix(signum)}")


def _main(target: str) -> int:
    module, _, function = target.partition(":")
    try:
        getattr(importlib.import_module(module), function)()
    except NativeProbeSkipped as exc:
        print(f"cannot probe: {exc}", file=sys.stderr)
        return CANNOT_PROBE
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
