"""Where mistral.rs actually put a loaded model, and whether PagedAttention runs, from its load log.

The wheel's name says which accelerator a build was compiled for, not what it runs on:
``mistralrs-cuda`` asks for ``Device::cuda_if_available(0)`` and quietly runs on the CPU when the
machine has no usable CUDA device, and even on a GPU mistral.rs turns PagedAttention off for a
mixed GPU/CPU layer mapping, on Windows, on Metal unless asked, and with ``no_paged_attn``. The
Python binding exposes neither the device nor the KV cache kind, but mistral.rs states both in the
log it prints while loading (to stdout, through ``tracing``)::

    Layers 0-29: cpu (24 GB)                              <- the device of every layer range
    Using f16 KV cache on CPU (set MISTRALRS_CPU_KV_F32=1 for f32).
    Configured PagedAttention scheduler max_num_seqs=8    <- only when PagedAttention is in use

So the backend captures that log while the ``Runner`` is built (the bytes are written back to
stdout unchanged afterwards) and reports the capabilities from it. mistral.rs prints the layer
placement once per process (measured with 0.9.5: a second load in the same process logs no
``Layers`` line), and it picks its device once per process too, so later loads are reported with
the device the first load stated (the notes say so). The PagedAttention scheduler line is
printed by every load that configures it. Without any placement line (``RUST_LOG`` filtering it,
a Runner created before the plugin's first load, a release that words it differently) the device
stays unconfirmed and PagedAttention is not claimed: a capability is claimed only on evidence.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import attrs

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: "Layers 0-29: cpu (24 GB)", "Layers 0-47: cuda[0] (79 GB)", "Layers 0-15: metal[0] ...".
_LAYERS = re.compile(r"Layers (\d+)-(\d+): ([A-Za-z]+)(\[\d+\])?")
#: Logged by mistral.rs's PagedAttention scheduler when it is configured (and by nothing else).
PAGED_MARKERS = ("Configured PagedAttention scheduler",)
#: mistral.rs's own word for "PagedAttention was asked for but cannot run here" at Runner().
PAGED_UNAVAILABLE = "paged attention is unavailable on this device"

# fd 1 is process-wide: two loads capturing it at once would restore each other's redirection.
_capture_lock = threading.Lock()


@attrs.frozen
class LoadLog:
    """What a load printed (ANSI colours removed); filled in when the capture ends."""

    lines: list[str] = attrs.field(factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@contextmanager
def captured_stdout() -> Iterator[LoadLog]:
    """Copy everything written to file descriptor 1 inside the block into the yielded LoadLog,
    then write it back to the real stdout (nothing is hidden, only read)."""
    log = LoadLog()
    with _capture_lock, tempfile.TemporaryFile() as sink:
        sys.stdout.flush()
        try:
            saved = os.dup(1)
        except OSError:  # no stdout at all (closed by a daemon): nothing to read, load anyway
            yield log
            return
        try:
            os.dup2(sink.fileno(), 1)
            yield log
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
            sink.seek(0)
            data = sink.read()
            if data:
                os.write(1, data)
            log.lines.extend(_ANSI.sub("", data.decode("utf-8", "replace")).splitlines())


@attrs.frozen(kw_only=True)
class RuntimePlacement:
    """The device(s) mistral.rs placed the model's layers on, and whether PagedAttention runs."""

    #: Device kinds in layer order, without ordinals: ("cpu",), ("cuda",), ("cuda", "cpu").
    devices: tuple[str, ...]
    paged_attention: bool
    #: The log lines this was read from (quoted in the capability notes).
    evidence: tuple[str, ...]

    @property
    def device(self) -> str:
        """``"cpu"``, ``"cuda"``, ``"metal"``, or a mixed mapping such as ``"cuda+cpu"``."""
        return "+".join(self.devices)


def parse_load_log(text: str) -> RuntimePlacement | None:
    """The placement stated by a mistral.rs load log, or None when the log states none."""
    devices: list[str] = []
    evidence: list[str] = []
    paged = False
    for line in _ANSI.sub("", text).splitlines():
        found = _LAYERS.search(line)
        if found:
            kind = found.group(3).lower()
            if kind not in devices:
                devices.append(kind)
            evidence.append(line[found.start():].strip())
        elif any(marker in line for marker in PAGED_MARKERS):
            paged = True
            evidence.append(line[line.index("Configured"):].strip())
    if not devices:
        return None
    return RuntimePlacement(devices=tuple(devices), paged_attention=paged, evidence=tuple(evidence))


_first_stated: RuntimePlacement | None = None
_first_lock = threading.Lock()


def placement_of_load(text: str) -> RuntimePlacement | None:
    """The placement of the load that printed ``text``: its own statement, else (mistral.rs states
    the layer placement once per process) the device stated by the first load of this process,
    with this load's own PagedAttention evidence."""
    global _first_stated
    stated = parse_load_log(text)
    with _first_lock:
        if stated is not None:
            if _first_stated is None:
                _first_stated = stated
            return stated
        earlier = _first_stated
    if earlier is None:
        return None
    paged = [line.strip() for line in _ANSI.sub("", text).splitlines()
             if any(marker in line for marker in PAGED_MARKERS)]
    evidence = (*earlier.evidence[:1], "stated by this process's first load: mistral.rs prints the "
                "placement once per process and keeps its device for every load", *paged)
    return RuntimePlacement(devices=earlier.devices, paged_attention=bool(paged), evidence=evidence)


def placement_notes(placement: RuntimePlacement | None, build_device: str) -> list[str]:
    """Capability notes saying where the device and PagedAttention answers came from."""
    if placement is None:
        return [f"device: not confirmed (mistral.rs printed no layer placement while loading, e.g. "
                f"RUST_LOG filtered it); reported as the build's target ({build_device}), and "
                "paged_attention is not claimed without evidence"]
    seen = "; ".join(placement.evidence)
    notes = [f"device: {placement.device}, from mistral.rs's load log ({seen})"]
    if placement.paged_attention:
        return notes
    if "cpu" in placement.devices and placement.devices != ("cpu",):
        why = "mistral.rs turns it off when the layers are split between a GPU and the CPU"
    elif placement.devices == ("cpu",):
        why = "mistral.rs has no PagedAttention kernels for the CPU"
    else:
        why = ("mistral.rs did not configure its PagedAttention scheduler on this device (it is off "
               "on Metal unless paged_attention = true, off on Windows, and off with paged_attention "
               "= false)")
    target = f" (whatever the {build_device} build targets)" if build_device != placement.device else ""
    notes.append(f"paged_attention: false: the model runs on {placement.device}{target} and {why}")
    return notes
