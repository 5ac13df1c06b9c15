"""Benchmarks: single-stream latency and multi-client serving throughput, every figure measured."""

from ruvllm.bench.serving import EngineTarget, HttpTarget, ServingConfig, run_serving, sweep
from ruvllm.bench.single import SingleStreamConfig, run_single_stream

__all__ = ["EngineTarget", "HttpTarget", "ServingConfig", "SingleStreamConfig", "run_serving",
           "run_single_stream", "sweep"]
