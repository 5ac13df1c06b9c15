"""CPU capability detection (ruvllm.hardware): parsing, the bf16 rule, and where it is shown."""

from __future__ import annotations

import builtins
import json
import os
import platform
import sys

import attrs
import pytest
from click.testing import CliRunner
from ruvllm import hardware
from ruvllm.cli import main
from ruvllm.hardware import CpuInfo, cpu_info, parse_cpuinfo

EPYC_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx avx2 fma f16c bmi2
processor\t: 1
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx avx2 fma f16c bmi2 avx512f avx512_bf16
"""
EPYC_BF16 = ("model name\t: AMD EPYC 9B14\n"
             "flags\t\t: avx2 fma f16c avx512f avx512_vnni avx512_bf16 avx512_fp16\n")
RASPBERRY_PI_5 = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
"""


def cpu(features: str, *, arch: str = "x86_64", limit: str | None = None) -> CpuInfo:
    return CpuInfo(arch=arch, model="test cpu", features=frozenset(features.split()), usable_cores=2,
                   logical_cores=2, memory_bytes=24 << 30, onednn_isa_limit=limit)


def test_x86_flags_of_the_first_cpu_only():
    model, features = parse_cpuinfo(EPYC_AVX2)
    assert model == "AMD EPYC 7B13"
    assert features == {"avx2", "fma", "f16c"}


def test_arm_features_use_common_names():
    _, features = parse_cpuinfo(RASPBERRY_PI_5)
    assert features == {"neon", "dotprod"}


def test_bf16_is_native_only_with_the_instructions():
    assert cpu("avx2 fma").fast_float_dtype() == "float32"
    assert "avx512_bf16 or amx_bf16 missing" in cpu("avx2 fma").bf16_missing()
    _, features = parse_cpuinfo(EPYC_BF16)
    fast = cpu(" ".join(features))
    assert fast.native_bf16 and fast.fast_float_dtype() == "bfloat16" and fast.bf16_missing() is None
    assert cpu("neon dotprod", arch="aarch64").bf16_missing().endswith("(bf16 (Armv8.6) missing)")
    assert cpu("neon bf16", arch="aarch64").native_bf16


def test_onednn_isa_limit_masks_bf16():
    """ONEDNN_MAX_CPU_ISA=AVX2 is how an AVX-512 host emulates the AVX2 kind: torch then has no
    native bf16 kernels, so auto must not pick bf16."""
    masked = cpu("avx2 avx512f avx512_bf16", limit="AVX2")
    assert not masked.native_bf16 and masked.fast_float_dtype() == "float32"
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in masked.bf16_missing()
    assert cpu("avx2 avx512f avx512_bf16", limit="AVX512_CORE_AMX").native_bf16


AMX_HOST = frozenset({"avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16",
                      "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16"})


@pytest.mark.parametrize(("limit", "kind", "left_out"), [
    ("AVX2", "avx2", {"avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile"}),
    ("avx2_vnni", "avx2", {"avx512f", "amx_tile"}),
    ("AVX512_CORE", "avx512", {"avx512_vnni", "avx512_bf16", "amx_int8"}),
    ("AVX512_CORE_VNNI", "avx512", {"avx512_bf16", "avx512_fp16", "amx_bf16"}),
    ("AVX512_CORE_BF16", "avx512", {"avx512_fp16", "amx_tile"}),
    ("AVX10_1_512", "avx512", {"amx_tile", "amx_int8", "amx_bf16"}),
    ("AVX10_1_512_AMX", "amx", set()),
    ("ALL", "amx", set()),
    ("NOT_A_LEVEL", "amx", set()),
])
def test_the_onednn_ceiling_is_the_machine_ruvllm_sees(monkeypatch, limit, kind, left_out):
    """ONEDNN_MAX_CPU_ISA emulates an older CPU for torch; ruvllm takes the same ceiling for its
    own choices (the kind, auto's backend, candle_like's int8 kernel), so the emulated machine is
    the older one throughout. What a native build reads (flags) stays the CPU's."""
    monkeypatch.setattr(hardware, "_detected", lambda: cpu(" ".join(AMX_HOST)))
    hardware._with_isa_limit.cache_clear()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", limit)
    try:
        seen = cpu_info()
        assert seen.kind == kind
        assert not seen.features & left_out and {"avx2", "fma", "f16c"} <= seen.features <= AMX_HOST
        assert limit.upper() != "AVX2" or seen.features == {"avx2", "fma", "f16c"}
        assert seen.flags == AMX_HOST
        assert seen.native_bf16 == ("avx512_bf16" in seen.features)
    finally:
        hardware._with_isa_limit.cache_clear()


def test_summary_and_dict_name_what_matters():
    info = cpu("avx2 fma avx512f avx512_bf16")
    assert "avx2 fma avx512f avx512_bf16" in info.summary() and "native bf16" in info.summary()
    d = info.as_dict()
    assert d["features"] == ["avx2", "fma", "avx512f", "avx512_bf16"] and d["fast_float_dtype"] == "bfloat16"


def test_this_machine_is_detected(monkeypatch):
    """What cpu_info() reports, checked against the operating system's own sources, read here
    without ruvllm.hardware: the affinity mask, the CPU count, the memory size and (on Linux)
    the first CPU's model name and flags in /proc/cpuinfo (unmasked: no emulated ceiling)."""
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    here = cpu_info()
    assert here.arch == (platform.machine().lower() or "unknown")
    assert here.logical_cores == (os.cpu_count() or 1)
    if hasattr(os, "sched_getaffinity"):
        assert here.usable_cores == len(os.sched_getaffinity(0))
    assert 1 <= here.usable_cores <= here.logical_cores
    if not sys.platform.startswith("linux"):
        return
    fields: dict[str, str] = {}
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            fields.setdefault(key.strip().lower(), value.strip())
    raw = set((fields.get("flags") or fields.get("features") or "").split())
    raw |= {"neon"} if "asimd" in raw else set()
    raw |= {"dotprod"} if "asimddp" in raw else set()
    assert here.features == {f for f in hardware.FEATURES if f in raw}
    if "model name" in fields:
        assert here.model == fields["model name"]
    with open("/proc/meminfo") as fh:
        total_kib = next(int(line.split()[1]) for line in fh if line.startswith("MemTotal:"))
    if here.memory_bytes is not None:  # None without psutil
        assert here.memory_bytes == total_kib * 1024


def test_detected_once_and_the_onednn_limit_still_honoured(monkeypatch):
    """/health and benchmark lines call cpu_info() often: the machine is read once per process
    (/proc/cpuinfo opened once, the memory size asked once), while ONEDNN_MAX_CPU_ISA (how an
    AVX2-only CPU is emulated) is honoured whenever it is set."""
    detections, cpuinfo_reads = [], []
    real = hardware._memory_bytes
    monkeypatch.setattr(hardware, "_memory_bytes", lambda: detections.append(1) or real())
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        if str(file) == "/proc/cpuinfo":
            cpuinfo_reads.append(1)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    hardware._detected.cache_clear()
    hardware._with_isa_limit.cache_clear()
    try:
        first = cpu_info()
        reads = len(cpuinfo_reads)
        assert reads == (1 if sys.platform.startswith("linux") else 0)
        assert cpu_info() is first and first.onednn_isa_limit is None
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
        emulated = cpu_info()
        assert emulated.onednn_isa_limit == "AVX2" and not emulated.native_bf16
        assert attrs.evolve(emulated, onednn_isa_limit=None, features=first.features) == first
        assert not emulated.features & {"avx_vnni", "avx512f", "avx512_vnni", "amx_tile"}
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
        assert cpu_info() is first
        assert len(detections) == 1 and len(cpuinfo_reads) == reads
    finally:
        hardware._detected.cache_clear()
        hardware._with_isa_limit.cache_clear()


#: Not this machine: the CLI must show what cpu_info() returns, not detect on its own.
SHOWN = CpuInfo(arch="x86_64", model="Shown Test CPU 9000", features=frozenset({"avx2", "fma"}),
                usable_cores=3, logical_cores=7, memory_bytes=24 << 30)


def test_cli_shows_the_machine(monkeypatch):
    from ruvllm.cli import backends, models

    monkeypatch.setattr(backends, "cpu_info", lambda: SHOWN)
    monkeypatch.setattr(models, "cpu_info", lambda: SHOWN)
    out = CliRunner().invoke(main, ["backends", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["machine"] == {
        "arch": "x86_64", "model": "Shown Test CPU 9000", "features": ["avx2", "fma"],
        "usable_cores": 3, "logical_cores": 7, "memory_bytes": 24 << 30, "native_bf16": False, "kind": "avx2",
        "fast_float_dtype": "float32", "onednn_isa_limit": None}
    text = CliRunner().invoke(main, ["backends"]).output
    assert SHOWN.summary() in " ".join(text.split())  # rich may wrap the line
    info = CliRunner().invoke(main, ["info", "default", "--json"])
    assert json.loads(info.output)["machine"] == SHOWN.summary()


def test_a_benchmark_says_when_its_kind_is_emulated(monkeypatch):
    """A plot's title and a table's caption name the kind; under ONEDNN_MAX_CPU_ISA they say it is
    emulated, so an AVX-512 host held to AVX2 is not passed off as an AVX2 machine."""
    from ruvllm.bench.machine import kind_label, machine_info

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert kind_label(machine_info()) == f"{cpu_info().kind} kind (emulated: ONEDNN_MAX_CPU_ISA=AVX2)"
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert kind_label(machine_info()) == f"{cpu_info().kind} kind"
