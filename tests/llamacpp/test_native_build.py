"""llama.cpp is built for the CPU it runs on (ruvllm_llamacpp.native_build): every kind's cmake
options from its recorded /proc/cpuinfo, the wheel keyed so that no build made another way is
reused, and the installed build checked (no AMX tile code anywhere; the set-up's key matches)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ruvllm import native_probe
from ruvllm.hardware import cpu_from_cpuinfo, cpu_info
from ruvllm_llamacpp import native_build, probe
from ruvllm_llamacpp.backend import LlamaCppBackend
from ruvllm_llamacpp.native_build import build_for, build_key, pinned_version

DATA = Path(__file__).resolve().parents[1] / "core" / "data"
ROOT = Path(__file__).resolve().parents[2]


def recorded(kind: str):
    return cpu_from_cpuinfo((DATA / f"cpuinfo_{kind}.txt").read_text())


@pytest.mark.parametrize("kind", ["avx2", "avx512"])
def test_amd_kinds_keep_the_native_build(kind):
    assert build_for(recorded(kind)).cmake_args == ("-DGGML_NATIVE=ON",)


def test_amx_kind_names_its_features_and_leaves_amx_out():
    args = dict(a.removeprefix("-D").split("=") for a in build_for(recorded("amx")).cmake_args)
    assert args["GGML_NATIVE"] == "OFF"
    assert all(args[f"GGML_AMX_{t}"] == "OFF" for t in ("TILE", "INT8", "BF16"))
    on = {k for k, v in args.items() if v == "ON"}
    assert on == {"GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_BMI2", "GGML_FMA", "GGML_F16C",
                  "GGML_AVX_VNNI", "GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16"}


@pytest.mark.parametrize(("kind", "limit", "left_out"), [
    ("avx512", "AVX2", {"GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16"}),
    ("amx", "AVX2", {"GGML_AVX_VNNI", "GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI",
                     "GGML_AVX512_BF16"}),
    ("amx", "AVX512_CORE_VNNI", {"GGML_AVX512_BF16"}),
])
def test_an_emulated_cpu_gets_the_build_that_cpu_would(kind, limit, left_out):
    """Under ONEDNN_MAX_CPU_ISA (how an older CPU is emulated, docs/hardware.md) llama.cpp is built
    with the features the ceiling leaves named, not -march=native: llama.cpp then runs what the
    older CPU would, and the build has a key of its own beside the native one."""
    host = recorded(kind)
    emulated = host.under_isa_limit(limit)
    build = build_for(emulated)
    args = dict(a.removeprefix("-D").split("=") for a in build.cmake_args)
    assert args["GGML_NATIVE"] == "OFF" and args["GGML_AVX2"] == args["GGML_FMA"] == "ON"
    assert all(args[option] == "OFF" for option in left_out)
    assert all(args[f"GGML_AMX_{t}"] == "OFF" for t in ("TILE", "INT8", "BF16"))
    assert f"ONEDNN_MAX_CPU_ISA={limit}" in build.why
    native = build_key(build_for(host), "0.3.36", "", "gcc 12", host)
    assert build_key(build, "0.3.36", "", "gcc 12", emulated) != native
    # A ceiling above every flag this CPU has is no emulation: the native build stays.
    assert build_for(recorded("avx512").under_isa_limit("ALL")).cmake_args == ("-DGGML_NATIVE=ON",)


def test_amx_on_is_asked_for_and_built_by_clang():
    """``--amx``: the AMX kernels, by the compiler that keeps their tile set-up; AMX kind only."""
    build = build_for(recorded("amx"), amx=True)
    args = dict(a.removeprefix("-D").split("=") for a in build.cmake_args)
    assert args["GGML_NATIVE"] == "OFF"
    assert all(args[f"GGML_AMX_{t}"] == "ON" for t in ("TILE", "INT8", "BF16"))
    # The macros ggml's AMX files test, which clang does not define (it names them __AMXINT8__...).
    env = dict(build.env)
    assert env["CC"] == "clang" and env["CXX"] == "clang++"
    macros = ["-D__AMX_INT8__", "-D__AMX_TILE__", "-D__AMX_BF16__"]
    assert env["CXXFLAGS"].split() == env["CFLAGS"].split() == macros
    assert build_for(recorded("amx")).env == ()
    amx = recorded("amx")
    default = build_key(build_for(amx), "0.3.36", "", "gcc 12", amx)
    assert build_key(build, "0.3.36", "", "clang 14", amx) != default
    with pytest.raises(ValueError, match="avx2 kind"):
        build_for(recorded("avx2"), amx=True)


def test_the_key_changes_with_whatever_the_binary_depends_on():
    avx2, avx512, amx = recorded("avx2"), recorded("avx512"), recorded("amx")
    base = build_key(build_for(avx2), "0.3.36", "", "gcc 12", avx2)
    # A native build compiled on another CPU is another binary, and so is one by another compiler,
    # of another version or with the user's own CMAKE_ARGS.
    assert len({base, build_key(build_for(avx512), "0.3.36", "", "gcc 12", avx512),
                build_key(build_for(avx2), "0.3.36", "", "clang 14", avx2),
                build_key(build_for(avx2), "0.3.37", "", "gcc 12", avx2),
                build_key(build_for(avx2), "0.3.36", "-DGGML_CUDA=ON", "gcc 12", avx2)}) == 5
    assert build_key(build_for(avx2), "0.3.36", "", "gcc 12", avx2) == base
    assert build_key(build_for(amx), "0.3.36", "", "gcc 12", amx) != base


def test_the_pinned_version_is_what_gets_built():
    assert pinned_version(ROOT / "constraints.txt") == native_build._version_installed()


def test_the_set_up_installed_the_build_for_this_cpu():
    """``make setup`` ran native_build: its record's key is this CPU's, for the installed version."""
    marker = Path(sys.prefix) / "llama-cpp-python-build.json"
    assert marker.is_file(), f"{marker} is missing: the set-up did not build llama-cpp-python (native_build)"
    record = json.loads(marker.read_text())
    cpu = cpu_info()
    build = build_for(cpu)
    assert record["cmake_args"] == list(build.cmake_args)
    assert record["key"] == build_key(build, native_build._version_installed(), record["extra_cmake_args"],
                                      native_build.compiler_id(build), cpu)


def test_the_installed_library_has_no_amx_tile_code():
    """The check docs/hardware.md gives for a build: llama.cpp's system info names no AMX and
    the CPU library holds no ``ldtilecfg`` (GCC 12's broken tile set-up starts with one)."""
    assert "AMX_INT8 = 1" not in probe.system_info()
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.fail("objdump (binutils) is needed to inspect the built library; apt-get install binutils")
    libraries = list((Path(probe._lib.lib().__file__).parent / "lib").glob("libggml-cpu*.so*"))
    assert libraries, "no libggml-cpu in the installed llama-cpp-python"
    for library in libraries:
        listing = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(library)], capture_output=True,
                                 text=True, check=True).stdout
        assert "ldtilecfg" not in listing and "tilezero" not in listing, library


def test_the_real_build_passes_its_probe(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    native_probe._outcome.cache_clear()
    try:
        assert native_probe.crash_reason("llamacpp", LlamaCppBackend.native_probe()) is None
        kept = list((tmp_path / "ruvllm" / native_probe.PROBES_DIR).glob("llamacpp-*.json"))
        assert len(kept) == 1 and json.loads(kept[0].read_text())["ok"] is True
    finally:
        native_probe._outcome.cache_clear()
