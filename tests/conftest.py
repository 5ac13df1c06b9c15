"""Fixtures shared across test packages."""

from __future__ import annotations

import pytest


@pytest.fixture
def emulated_cpu(monkeypatch):
    """``emulated_cpu(info)`` makes candle_like and SONA see ``info`` (a ruvllm.hardware.CpuInfo)
    as this machine's CPU, with nothing warned about yet in this process: how one host tests the
    dtype rules of both machine kinds."""
    from ruvllm_candle_like import cpu_dtype

    monkeypatch.setattr(cpu_dtype, "_warned", set())

    def use(info) -> None:
        monkeypatch.setattr(cpu_dtype, "cpu_info", lambda: info)

    return use
