"""Probe functions the crash-guard tests run in a child (tests/core/test_native_probe.py): a
native library that dies on this CPU, one that runs, and one that cannot be probed here."""

from __future__ import annotations

import os
import signal

from ruvllm.errors import NativeProbeSkipped


def dies_of_sigill() -> None:
    os.kill(os.getpid(), signal.SIGILL)


def aborts() -> None:
    print("ggml.c:1234: GGML_ASSERT(n_outputs_max <= cparams.n_outputs_max) failed", file=os.sys.stderr)
    os.abort()


def runs() -> None:
    return None


def has_no_model() -> None:
    raise NativeProbeSkipped("no model to probe with")
