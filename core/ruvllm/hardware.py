"""What this CPU computes fast: ISA features, cores and memory, detected once, in one place.

Machines differ in ways that change what is fast and even what is numerically identical: an
AMD EPYC with AVX-512 and native bf16 runs torch's bf16 matmuls (and their backward) in oneDNN
kernels, while an AVX2-only CPU falls back to a slow reference kernel for bf16 and oneDNN packs
no bf16 weights; a Raspberry Pi has NEON and maybe dotprod, no AVX at all. Every choice that
depends on this (``dtype = "auto"``, packed weights, which tests make sense here) asks this
module instead of guessing, and ``ruvllm backends`` / ``ruvllm info`` / benchmark headers /
``/health`` show what it found.

Detection reads ``/proc/cpuinfo`` (Linux, x86 and Arm) or ``sysctl`` (macOS) and imports no
engine library, so it costs nothing at start-up. oneDNN's ``ONEDNN_MAX_CPU_ISA`` (the knob used
to emulate an older CPU on a newer one) is honoured: below ``AVX512_CORE_BF16`` torch has no
native bf16 kernels even on a CPU that has the instructions.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from typing import Any

import attrs

#: The features ruvllm reports, in display order. x86 names are the kernel's flag names; Arm's
#: ``asimd`` is reported as ``neon`` and ``asimddp`` as ``dotprod``.
FEATURES = (
    "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8", "neon", "dotprod", "i8mm", "sve", "sve2", "bf16",
)
_ARM_ALIASES = {"asimd": "neon", "asimddp": "dotprod"}
#: macOS ``sysctl hw.optional.*`` keys for the Arm features (Apple Silicon has NEON always).
_MACOS_KEYS = {"dotprod": "hw.optional.arm.FEAT_DotProd", "i8mm": "hw.optional.arm.FEAT_I8MM",
               "bf16": "hw.optional.arm.FEAT_BF16", "avx2": "hw.optional.avx2_0",
               "avx512f": "hw.optional.avx512f"}
#: The machine kinds ruvllm tells apart (:attr:`CpuInfo.kind`), each with what it is.
CPU_KINDS = {
    "amx": "x86-64 with AVX-512 and AMX tiles, e.g. Intel Xeon Sapphire Rapids and later",
    "avx512": "x86-64 with AVX-512 and no AMX, e.g. AMD EPYC Zen 4/5",
    "avx2": "x86-64 with AVX2 and no AVX-512, e.g. AMD EPYC Zen 2/3",
    "x86-64": "x86-64 without AVX2",
    "arm": "Arm with NEON, e.g. Raspberry Pi, Graviton, Apple Silicon",
    "other": "neither x86-64 nor Arm",
}
#: oneDNN's ISA levels (``ONEDNN_MAX_CPU_ISA``), lowest first, with its AVX10 names for two of them.
ONEDNN_ISA_LEVELS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
                     "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16")
_ONEDNN_ALIASES = {"AVX10_1_512": "AVX512_CORE_FP16", "AVX10_1_512_AMX": "AVX512_CORE_AMX",
                   "AVX10_1_512_AMX_FP16": "AVX512_CORE_AMX_FP16"}
#: The lowest oneDNN level that admits each x86 feature of :data:`FEATURES` (and, by prefix in
#: :func:`_level_of`, every other AVX-512, AVX-VNNI and AMX flag): a lower ``ONEDNN_MAX_CPU_ISA``
#: takes the feature out of what ruvllm uses (:func:`features_under`).
_LEVEL_OF_FEATURE = {"avx2": "AVX2", "fma": "AVX2", "f16c": "AVX2", "avx_vnni": "AVX2_VNNI",
                     "avx512f": "AVX512_CORE", "avx512_vnni": "AVX512_CORE_VNNI",
                     "avx512_bf16": "AVX512_CORE_BF16", "avx512_fp16": "AVX512_CORE_FP16"}
#: The flags of native bf16 arithmetic (x86's AVX512_BF16 and AMX-BF16, Armv8.6 BF16).
_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
_LEVEL_OF_PREFIX = (("amx", "AVX512_CORE_AMX"), ("avx512", "AVX512_CORE"), ("avx_vnni", "AVX2_VNNI"))
#: What the warning quotes for bf16 on a CPU without native bf16 (measured on a 2-core AMD EPYC
#: with AVX2 only, embedded SmolLM2-135M; see docs/hardware.md).
BF16_WITHOUT_NATIVE_COST = ("bf16 backward (training) falls to torch's single-threaded reference "
                            "gemm: a 2-minute SONA run took over 20 minutes; oneDNN packs no bf16 weights")


@attrs.frozen(kw_only=True)
class CpuInfo:
    """One machine's CPU as ruvllm sees it."""

    arch: str
    model: str
    #: The :data:`FEATURES` ruvllm may use: those the OS reports, less any ``ONEDNN_MAX_CPU_ISA``
    #: masks (:func:`features_under`). Every choice made from the CPU reads these.
    features: frozenset[str]
    #: CPUs this process may run on (affinity), and all logical CPUs of the machine.
    usable_cores: int
    logical_cores: int
    memory_bytes: int | None
    #: ``ONEDNN_MAX_CPU_ISA`` when set (an emulated, lower ISA for torch's kernels).
    onednn_isa_limit: str | None = None
    #: Every ISA flag the OS reports, unmasked: what a native build (llama.cpp's cmake flags) is
    #: derived from, and what the CPU physically has. Defaults to ``features``.
    flags: frozenset[str] = attrs.field(
        default=attrs.Factory(lambda self: self.features, takes_self=True))

    def under_isa_limit(self, limit: str | None) -> CpuInfo:
        """This CPU as it is seen under ``ONEDNN_MAX_CPU_ISA=limit`` (None: as detected)."""
        return attrs.evolve(self, onednn_isa_limit=limit, features=features_under(limit, self.features))

    @property
    def usable_flags(self) -> frozenset[str]:
        """:attr:`flags` less what ``ONEDNN_MAX_CPU_ISA`` masks: what a build for the emulated
        machine may use (ruvllm_llamacpp.native_build)."""
        return features_under(self.onednn_isa_limit, self.flags)

    @property
    def kind(self) -> str:
        """Which of :data:`CPU_KINDS` this CPU is: the classes of machine that differ in what
        runs, how fast, and with which numerics (see docs/hardware.md)."""
        if self.arch in ("aarch64", "arm64") or "neon" in self.features:
            return "arm"
        if self.arch not in ("x86_64", "amd64", "i686", "x86"):
            return "other"
        if self.has("amx_tile") and self.features & {"amx_int8", "amx_bf16"}:
            return "amx"
        if self.has("avx512f"):
            return "avx512"
        return "avx2" if self.has("avx2") else "x86-64"

    def kind_summary(self) -> str:
        """The kind and what it means, for ``ruvllm backends`` and benchmark headers."""
        return f"{self.kind} ({CPU_KINDS[self.kind]})"

    def has(self, feature: str) -> bool:
        return feature in self.features

    @property
    def bf16_instructions(self) -> bool:
        """The CPU has native bf16 arithmetic (AVX512_BF16, AMX-BF16 or Armv8.6 BF16), masked or not."""
        return bool(self.flags & _BF16_FLAGS)

    @property
    def native_bf16(self) -> bool:
        """torch's CPU kernels can use native bf16 here (instructions present and not masked)."""
        return bool(self.usable_flags & _BF16_FLAGS)

    def bf16_missing(self) -> str | None:
        """Why bf16 is not native here, naming the missing feature (None when it is)."""
        if self.native_bf16:
            return None
        if self.bf16_instructions:
            return f"ONEDNN_MAX_CPU_ISA={self.onednn_isa_limit} masks this CPU's bf16 instructions"
        wanted = "bf16 (Armv8.6)" if self.arch in ("aarch64", "arm64") else "avx512_bf16 or amx_bf16"
        return f"this CPU has no native bf16 instructions ({wanted} missing)"

    def fast_float_dtype(self) -> str:
        """The float dtype ``dtype = "auto"`` picks on the CPU: bf16 only where it is native."""
        return "bfloat16" if self.native_bf16 else "float32"

    def summary(self) -> str:
        """One line for logs and benchmark headers (the kind first: see :meth:`kind_summary`)."""
        shown = [f for f in FEATURES if f in self.features] or ["none of " + "/".join(FEATURES[:3])]
        mem = f"{self.memory_bytes / 2**30:.1f} GiB" if self.memory_bytes else "memory unknown"
        limit = f", ONEDNN_MAX_CPU_ISA={self.onednn_isa_limit}" if self.onednn_isa_limit else ""
        bf16 = "native bf16" if self.native_bf16 else "no native bf16"
        return (f"{self.kind} kind: {self.model} ({self.arch}), {self.usable_cores}/{self.logical_cores} "
                f"cores, {mem}; {' '.join(shown)}; {bf16}{limit}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "arch": self.arch, "model": self.model, "kind": self.kind,
            "features": [f for f in FEATURES if f in self.features],
            "usable_cores": self.usable_cores, "logical_cores": self.logical_cores,
            "memory_bytes": self.memory_bytes, "native_bf16": self.native_bf16,
            "fast_float_dtype": self.fast_float_dtype(), "onednn_isa_limit": self.onednn_isa_limit,
        }


def _level_of(flag: str) -> str | None:
    """The oneDNN level that admits an x86 flag, None for one no level masks (sse4_2, bmi2, Arm's)."""
    if flag in _LEVEL_OF_FEATURE:
        return _LEVEL_OF_FEATURE[flag]
    return next((level for prefix, level in _LEVEL_OF_PREFIX if flag.startswith(prefix)), None)


def features_under(limit: str | None, features: frozenset[str]) -> frozenset[str]:
    """``features`` (feature or flag names) less the x86 ones an ``ONEDNN_MAX_CPU_ISA`` of
    ``limit`` leaves out.

    That variable is how a newer CPU emulates an older one for torch's oneDNN kernels (with
    ``ATEN_CPU_CAPABILITY`` for ATen's). ruvllm applies the same ceiling to every choice it makes
    from the CPU (its kind, ``auto``'s backend, candle_like's dtype and int8 kernel), so that an
    emulated AVX2 machine runs what a real one would. An unknown level (``DEFAULT``, ``ALL``)
    masks nothing."""
    level = _ONEDNN_ALIASES.get((limit or "").upper(), (limit or "").upper())
    if level not in ONEDNN_ISA_LEVELS:
        return features
    rank = ONEDNN_ISA_LEVELS.index(level)
    return frozenset(f for f in features
                     if (needs := _level_of(f)) is None or ONEDNN_ISA_LEVELS.index(needs) <= rank)


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """Model name and reported features (:data:`FEATURES`) from ``/proc/cpuinfo`` text."""
    model, flags = parse_cpuinfo_flags(text)
    return model, flags & frozenset(FEATURES)


def parse_cpuinfo_flags(text: str) -> tuple[str, frozenset[str]]:
    """Model name and every ISA flag from ``/proc/cpuinfo`` text (x86 ``flags`` or Arm
    ``Features``, Arm's under their common names); only the first CPU's lines are read, the
    others repeat them."""
    model = ""
    raw: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not raw:
            raw = set(value.split())
    return model, frozenset(_ARM_ALIASES.get(f, f) for f in raw)


def cpu_from_cpuinfo(text: str, *, arch: str = "x86_64", cores: int = 2) -> CpuInfo:
    """A :class:`CpuInfo` from recorded ``/proc/cpuinfo`` text: how tests see every machine kind
    on any host (tests/core/data/cpuinfo_*.txt)."""
    model, flags = parse_cpuinfo_flags(text)
    return CpuInfo(arch=arch, model=model or arch, features=flags & frozenset(FEATURES), flags=flags,
                   usable_cores=cores, logical_cores=cores, memory_bytes=None)


def _macos_features() -> frozenset[str]:
    found = set()
    if platform.machine() == "arm64":
        found.add("neon")
    for name, key in _MACOS_KEYS.items():
        try:
            out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            continue
        if out.stdout.strip() == "1":
            found.add(name)
    return frozenset(found)


def _memory_bytes() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # psutil missing or unsupported platform: memory is informational only
        return None


@functools.cache
def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask (containers, ``taskset``, pinned test
    workers), not the machine's count. Engines size their compute threads from it: a pool sized
    for the machine on a process pinned to fewer CPUs spin-waits for threads that share a CPU
    (mistral.rs pinned to one CPU with two compute threads: 1.2 vs 8.7 tok/s)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_info() -> CpuInfo:
    """This machine's CPU, detected once per process.

    Reading ``/proc/cpuinfo`` (or ``sysctl`` on macOS) and the memory size is done once
    (:func:`_detected`); ``/health`` and every benchmark line used to repeat it on each call.
    ``ONEDNN_MAX_CPU_ISA`` is read on each call (one environment lookup) so that a process or a
    test that sets it to emulate an AVX2-only CPU sees the emulated machine without re-detecting
    the real one; each value gets one cached :class:`CpuInfo`."""
    return _with_isa_limit(os.environ.get("ONEDNN_MAX_CPU_ISA") or None)


@functools.cache
def _with_isa_limit(limit: str | None) -> CpuInfo:
    return _detected().under_isa_limit(limit)


@functools.cache
def _detected() -> CpuInfo:
    """The hardware as the operating system reports it, without the oneDNN limit."""
    arch = platform.machine().lower() or "unknown"
    model, flags = "", frozenset()
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo") as fh:
                model, flags = parse_cpuinfo_flags(fh.read())
        except OSError:
            pass
    elif sys.platform == "darwin":
        flags = _macos_features()
        try:
            model = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                   text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            model = ""
    return CpuInfo(arch=arch, model=model or platform.processor() or arch,
                   features=flags & frozenset(FEATURES), flags=flags, usable_cores=usable_cpus(),
                   logical_cores=os.cpu_count() or 1, memory_bytes=_memory_bytes())
