"""Every CPU kind on any host: recorded /proc/cpuinfo of each kind (tests/core/data) gives its
kind, its float dtype and its llama.cpp build, whatever machine runs the test."""

from __future__ import annotations

from pathlib import Path

import pytest
from cpu_tolerances import AVX2_BOUNDS, isolation_bounds
from ruvllm.hardware import CPU_KINDS, cpu_from_cpuinfo

DATA = Path(__file__).resolve().parent / "data"
RASPBERRY_PI_5 = "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp asimddp\n"


def recorded(kind: str):
    return cpu_from_cpuinfo((DATA / f"cpuinfo_{kind}.txt").read_text())


KINDS = [("avx2", "float32"), ("avx512", "bfloat16"), ("amx", "bfloat16")]


@pytest.mark.parametrize(("kind", "dtype"), KINDS)
def test_recorded_kinds(kind, dtype):
    cpu = recorded(kind)
    assert cpu.kind == kind
    assert cpu.fast_float_dtype() == dtype
    assert cpu.summary().startswith(f"{kind} kind: ")
    assert cpu.as_dict()["kind"] == kind and CPU_KINDS[kind] in cpu.kind_summary()


def test_amx_needs_its_tiles_not_only_avx512():
    amx = recorded("amx")
    assert {"amx_tile", "amx_int8", "amx_bf16", "avx512_fp16"} <= amx.features
    without_tiles = cpu_from_cpuinfo((DATA / "cpuinfo_amx.txt").read_text().replace(" amx_tile", ""))
    assert without_tiles.kind == "avx512"


def test_every_flag_is_kept_for_native_builds():
    """``features`` is what ruvllm shows; ``flags`` is all the kernel reports (AVX-512's CD, VL,
    DQ, BW, VBMI: what llama.cpp's cmake options are derived from)."""
    avx512 = recorded("avx512")
    assert {"avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512vbmi"} <= avx512.flags
    assert "avx512cd" not in avx512.features and avx512.features <= avx512.flags


def test_arm():
    pi = cpu_from_cpuinfo(RASPBERRY_PI_5, arch="aarch64")
    assert pi.kind == "arm" and {"neon", "dotprod"} <= pi.features and pi.fast_float_dtype() == "float32"


@pytest.mark.parametrize(("kind", "bounds"), [("avx2", AVX2_BOUNDS), ("avx512", {}), ("amx", {})])
def test_isolation_bounds_by_kind(kind, bounds):
    assert isolation_bounds(recorded(kind)) == bounds
    assert isolation_bounds(cpu_from_cpuinfo(RASPBERRY_PI_5, arch="aarch64")) == AVX2_BOUNDS
