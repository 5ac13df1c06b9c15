"""Builds ruvllm's native CPU kernels (csrc/, see ruvllm_candle_like/native.py).

Metadata lives in pyproject.toml; this file only declares the native library. It is optional:
where it cannot be built (no C++ compiler, or a CPU family the kernel has no code for) the
plugin installs without it and runs on PyTorch's kernels, saying why.
"""

import platform

from setuptools import Extension, setup


def native_extensions() -> list[Extension]:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    return [Extension(
        "ruvllm_candle_like._native",
        ["csrc/blockmm.cpp", "csrc/blockmm_int8.cpp", "csrc/block_rows.cpp", "csrc/paged_attention.cpp",
         "csrc/decoder.cpp"],
        depends=["csrc/kernels.h"], language="c++", optional=True,
        # The kernels carry their own AVX2/FMA (and AVX-512) targets; the library loads on any x86-64.
        extra_compile_args=["-O3", "-std=c++17", "-fopenmp"], extra_link_args=["-fopenmp"],
    )]


setup(ext_modules=native_extensions())
