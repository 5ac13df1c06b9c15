"""Build llama-cpp-python for the CPU it will run on, and never reuse a build made another way.

llama-cpp-python compiles llama.cpp at install time with ``GGML_NATIVE`` (``-march=native``).
That is right on most CPUs and wrong on one kind: on an Intel Xeon with AMX (the ``amx`` kind of
:mod:`ruvllm.hardware`) ``-march=native`` turns on ggml's AMX int8 kernels, and GCC 12 (Debian
12's compiler) miscompiles their tile set-up: in ``ggml_tile_config_init``
(``ggml-cpu/amx/mmq.cpp``) it drops the stores of the rows and column widths into the stack
``tile_config_t`` and loads a configuration of zero-row tiles, so the first ``tilezero`` raises
#UD and the process dies with "Illegal instruction". The object code shows it on any host:
``g++ -O3 -march=sapphirerapids -c mmq.cpp`` zeroes 64 bytes, stores ``palette_id = 1`` and runs
``ldtilecfg`` (``-fno-tree-dse`` does not keep the stores). Upstream llama.cpp PR 26954 (open)
moves the configuration off the stack.

So on the AMX kind the build names the CPU's other features explicitly (``GGML_NATIVE=OFF``:
AVX-512 with VBMI, VNNI and BF16, AVX-VNNI, ...) and leaves the AMX kernels out. ``--amx`` builds
them with clang instead, which compiles the tile set-up correctly, so that an AMX host can
measure them against this default before they could become it. Appending
``-mno-amx-*`` to ``CMAKE_C(XX)_FLAGS`` would not do: GCC expands ``-march=native`` into explicit
``-mamx-tile -mamx-int8 ...`` options, and ggml adds ``-march=native`` after the cmake flags, so
the later, explicit ``-mamx-*`` would win. Every other kind keeps today's native build.

pip caches the wheel it builds under the sdist's name, whatever ``CMAKE_ARGS`` were (and
whichever CPU built it), so a second install would hand back a wheel built the wrong way. The
set-up therefore builds the wheel itself with pip's cache off, into a directory of its own keyed
by everything the binary depends on (:func:`build_key`), and installs that file.

    python -m ruvllm_llamacpp.native_build            # what the Makefile runs
    python -m ruvllm_llamacpp.native_build --show     # the flags and key for this CPU, no build
    python -m ruvllm_llamacpp.native_build --amx      # AMX kind: AMX kernels on, built by clang
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import attrs
from ruvllm.hardware import CpuInfo, cpu_info

PACKAGE = "llama-cpp-python"

#: ggml's x86 options and the kernel flags each needs (all of them); GGML_AVX512 is ggml's
#: AVX-512 foundation set (F, CD, VL, DQ, BW).
_X86_OPTIONS = (
    ("GGML_SSE42", ("sse4_2",)),
    ("GGML_AVX", ("avx",)),
    ("GGML_AVX2", ("avx2",)),
    ("GGML_BMI2", ("bmi2",)),
    ("GGML_FMA", ("fma",)),
    ("GGML_F16C", ("f16c",)),
    ("GGML_AVX_VNNI", ("avx_vnni",)),
    ("GGML_AVX512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")),
    ("GGML_AVX512_VBMI", ("avx512vbmi",)),
    ("GGML_AVX512_VNNI", ("avx512_vnni",)),
    ("GGML_AVX512_BF16", ("avx512_bf16",)),
)
#: Off unless asked for (``--amx``): see the module docstring.
_AMX_OPTIONS = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
#: ``--amx`` builds with clang: clang 14 keeps the tile configuration's stores (its object code
#: stores the rows and column bytes before ``ldtilecfg``), where GCC 12 drops them. clang names
#: its AMX macros ``__AMXINT8__``, not the ``__AMX_INT8__`` ggml tests (and ggml defines only
#: ``GGML_AMX_INT8`` outside MSVC), so without these defines clang compiles ggml's AMX files
#: empty: ``GGML_AMX_INT8=ON`` alone gave a 664-byte ``mmq.cpp.o`` with no tile instruction.
_AMX_MACROS = "-D__AMX_INT8__ -D__AMX_TILE__ -D__AMX_BF16__"
#: Through the environment (cmake reads CFLAGS/CXXFLAGS at configure), not CMAKE_ARGS, whose
#: values cannot hold a space.
AMX_ENV = (("CC", "clang"), ("CXX", "clang++"), ("CFLAGS", _AMX_MACROS), ("CXXFLAGS", _AMX_MACROS))


@attrs.frozen
class LlamaCppBuild:
    """How llama.cpp is compiled for one CPU, and why."""

    cmake_args: tuple[str, ...]
    why: str
    #: Environment the build needs (compilers, their flags); empty: cmake's defaults.
    env: tuple[tuple[str, str], ...] = ()

    @property
    def native(self) -> bool:
        return "-DGGML_NATIVE=ON" in self.cmake_args


def build_for(cpu: CpuInfo, *, amx: bool = False) -> LlamaCppBuild:
    """The cmake options for ``cpu``: the native build, except on the AMX kind, and for an
    emulated older CPU (``ONEDNN_MAX_CPU_ISA`` masking some of this one's flags, ruvllm.hardware),
    which gets the features it leaves named, so that llama.cpp runs what that CPU would. ``amx``
    asks for ggml's AMX kernels, compiled by clang (to measure them against the default; AMX kind
    only)."""
    if amx and cpu.kind != "amx":
        raise ValueError(f"--amx needs a CPU with AMX tiles; this one is of the {cpu.kind} kind")
    flags = cpu.usable_flags
    emulated = flags != cpu.flags
    if cpu.kind != "amx" and not emulated:
        return LlamaCppBuild(("-DGGML_NATIVE=ON",),
                             f"{cpu.kind} kind: llama.cpp's native build (-march=native)")
    named = [f"-D{option}={'ON' if all(f in flags for f in needs) else 'OFF'}"
             for option, needs in _X86_OPTIONS]
    if amx and not emulated:
        return LlamaCppBuild(
            ("-DGGML_NATIVE=OFF", *named, *(f"-D{option}=ON" for option in _AMX_OPTIONS)),
            "amx kind, AMX kernels on (--amx), compiled by clang", env=AMX_ENV)
    why = (f"emulated {cpu.kind} kind (ONEDNN_MAX_CPU_ISA={cpu.onednn_isa_limit}): the features it leaves "
           "named, no more" if emulated else
           "amx kind: this CPU's features named, AMX left out (GCC 12 miscompiles ggml's AMX tile "
           "set-up: every tile gets 0 rows and the first tile instruction dies with SIGILL)")
    return LlamaCppBuild(("-DGGML_NATIVE=OFF", *named, *(f"-D{option}=OFF" for option in _AMX_OPTIONS)), why)


def compiler_id(build: LlamaCppBuild | None = None) -> str:
    """The C++ compiler cmake will pick for ``build``, as ``--version`` names it."""
    compiler = dict(build.env if build else ()).get("CXX") or os.environ.get("CXX", "c++")
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return f"{compiler} (not runnable)"
    return out.stdout.splitlines()[0] if out.stdout else compiler


def build_key(build: LlamaCppBuild, version: str, extra_args: str, compiler: str, cpu: CpuInfo) -> str:
    """What the binary depends on, hashed: the package version, every cmake option, the compiler
    and, for a native build, the CPU's flags (``-march=native`` compiles for the building CPU: a
    wheel built on an AVX-512 host dies on an AVX2 one)."""
    parts = [version, *build.cmake_args, *(f"{k}={v}" for k, v in build.env), extra_args, compiler, cpu.arch]
    if build.native:
        parts += sorted(cpu.flags)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def wheel_cache() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "ruvllm" / "llama-cpp-python"


def _installed(venv_marker: Path) -> dict | None:
    try:
        return json.loads(venv_marker.read_text())
    except (OSError, ValueError):
        return None


def planned(version: str, *, amx: bool = False, extra: str = "") -> tuple[LlamaCppBuild, str]:
    """This CPU's build of ``version`` and its key (``extra``: the user's own CMAKE_ARGS)."""
    cpu = cpu_info()
    build = build_for(cpu, amx=amx)
    return build, build_key(build, version, extra, compiler_id(build), cpu)


def ensure_installed(version: str, build: LlamaCppBuild, key: str, *, extra: str, pip: list[str],
                     marker: Path) -> str:
    """Install llama-cpp-python ``version`` as ``build`` (:func:`planned`); a no-op when the build
    installed is already that one. Returns a line saying what was done."""
    if (_installed(marker) or {}).get("key") == key and _version_installed() == version:
        return f"{PACKAGE} {version} already built for this CPU ({build.why}; key {key})"
    wheels = wheel_cache() / key
    wheel = next(iter(sorted(wheels.glob("*.whl"))), None)
    if wheel is None:
        wheel = _build_wheel(version, build, extra, wheels)
    subprocess.run([*pip, "install", "--quiet", "--no-deps", "--force-reinstall", str(wheel)], check=True)
    marker.write_text(json.dumps({"key": key, "version": version, "cmake_args": list(build.cmake_args),
                                  "extra_cmake_args": extra, "why": build.why}, indent=2))
    return f"installed {wheel.name} ({build.why}; key {key})"


def _version_installed() -> str | None:
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return None


def _build_wheel(version: str, build: LlamaCppBuild, extra: str, into: Path) -> Path:
    """Compile the sdist into ``into`` with pip's cache off (so no wheel built another way is
    reused, and this one is kept only here, under its key)."""
    cmake_args = shlex.join([*build.cmake_args, *shlex.split(extra)])  # split again by shlex
    print(f"building {PACKAGE} {version} for this CPU: {build.why}\n  CMAKE_ARGS={cmake_args}\n"
          f"  about 5 minutes on 2 cores; kept in {into}", flush=True)
    staging = into.with_name(into.name + ".partial")
    staging.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-cache-dir",
                    "--no-binary", PACKAGE, "-w", str(staging), f"{PACKAGE}=={version}"],
                   check=True,
                   env={**os.environ, "CMAKE_ARGS": cmake_args, "FORCE_CMAKE": "1", **dict(build.env)})
    staging.replace(into)
    print(f"built in {time.monotonic() - started:.0f} s", flush=True)
    return next(iter(sorted(into.glob("*.whl"))))


def pinned_version(constraints: Path) -> str:
    """The version ``constraints.txt`` pins for llama-cpp-python."""
    for line in constraints.read_text().splitlines():
        name, sep, pinned = line.partition("==")
        if sep and name.strip().lower() == PACKAGE:
            return pinned.split("#", 1)[0].strip()
    raise SystemExit(f"{constraints} pins no {PACKAGE} version")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ruvllm_llamacpp.native_build", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--constraints", type=Path, default=Path("constraints.txt"))
    parser.add_argument("--show", action="store_true", help="print the flags and key; build nothing")
    parser.add_argument("--amx", action="store_true",
                        help="AMX kind only: build ggml's AMX kernels with clang (apt-get install clang "
                             "libomp-dev), to measure them against the default build")
    args = parser.parse_args(argv)
    version = pinned_version(args.constraints)
    marker = Path(sys.prefix) / "llama-cpp-python-build.json"
    extra = os.environ.get("CMAKE_ARGS", "")
    try:
        build, key = planned(version, amx=args.amx, extra=extra)
    except ValueError as exc:
        parser.error(str(exc))
    if args.show:
        print(json.dumps({"cpu_kind": cpu_info().kind, "cmake_args": list(build.cmake_args), "why": build.why,
                          "key": key, "installed": _installed(marker)}, indent=2))
        return
    pip = [sys.executable, "-m", "pip"]
    done = ensure_installed(version, build, key, extra=extra, pip=pip, marker=marker)
    print(done, flush=True)


if __name__ == "__main__":
    main()
