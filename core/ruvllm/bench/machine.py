"""What a benchmark ran on: machine, Python, ruvllm and engine library versions.

Figures vary between machines and even between process launches on one machine, so every
result carries this record; comparisons are meaningful only within one record.
"""

from __future__ import annotations

import os
import platform
import time
from importlib import metadata
from typing import Any

from ruvllm.hardware import cpu_info

_LIBRARIES = ("ruvllm", "llama-cpp-python", "torch", "mlx", "mistralrs", "numpy", "fastapi", "uvicorn")


def versions() -> dict[str, str]:
    out = {}
    for name in _LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def machine_line() -> str:
    """The header line every benchmark prints first: CPU, ISA features, cores, memory, load."""
    load = f"load {os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "load unknown"
    return f"machine: {cpu_info().summary()} | {platform.platform()} | {load}"


def kind_label(machine: dict[str, Any]) -> str:
    """``avx2 kind``, saying so when the kind is emulated (``ONEDNN_MAX_CPU_ISA``,
    ruvllm.hardware): a plot's title or a table's caption must not pass an AVX-512 host held to
    AVX2 off as an AVX2 machine."""
    features = machine.get("cpu_features", {})
    limit = features.get("onednn_isa_limit")
    emulated = f" (emulated: ONEDNN_MAX_CPU_ISA={limit})" if limit else ""
    return f"{features.get('kind', 'unknown')} kind{emulated}"


def machine_info() -> dict[str, Any]:
    import psutil

    cpu = cpu_info()
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu": cpu.model,
        "cpu_features": cpu.as_dict(),
        "logical_cpus": os.cpu_count(),
        "physical_cpus": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "versions": versions(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
