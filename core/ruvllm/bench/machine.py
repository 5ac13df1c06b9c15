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

_LIBRARIES = ("ruvllm", "llama-cpp-python", "torch", "mlx", "mistralrs", "numpy", "fastapi", "uvicorn")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict[str, str]:
    out = {}
    for name in _LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def machine_info() -> dict[str, Any]:
    import psutil

    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "physical_cpus": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "versions": versions(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
