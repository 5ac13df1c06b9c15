"""mlx decode throughput: one stream (request level) and C streams in one batched forward per
step (the executor), for each weight mode, on the embedded model.

    .venv/bin/python benchmarks/mlx_decode.py --batch 16 --tokens 16 --runs 3

Prints the machine, model, settings and the median of --runs runs; every figure is measured.
Compare ratios from one run: figures vary between launches on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from ruvllm.bench.machine import machine_info
from ruvllm.executor import BatchEntry
from ruvllm.models import ModelSource
from ruvllm.registry import embedded_model_path
from ruvllm.types import GenerationParams
from ruvllm_mlx import cpu_blas
from ruvllm_mlx.backend import MlxBackend
from ruvllm_mlx.mlx_core import mx  # MLX's CPU BLAS is set up before MLX is imported

PROMPT = "Explain in one sentence why the sky is blue."


def single_stream(backend: MlxBackend, ids: list[int], n: int) -> float:
    """Decode tokens per second after the first token (prefill excluded)."""
    gen = backend.generate(ids, GenerationParams(max_tokens=n, ignore_eos=True))
    next(gen)
    t0 = time.perf_counter()
    for _ in range(n - 1):
        next(gen)
    dt = time.perf_counter() - t0
    gen.close()
    return (n - 1) / dt


def batched(backend: MlxBackend, ids: list[int], batch: int, n: int) -> float:
    """Aggregate decode tokens per second of ``batch`` sequences stepping together."""
    ex = backend.create_executor(max_sequences=batch, block_size=16)
    logits = ex.execute([BatchEntry(seq_id=i, tokens=tuple(ids), start_pos=0, block_table=())
                         for i in range(batch)])
    last = [int(row.argmax()) for row in logits]
    pos = len(ids)
    t0 = time.perf_counter()
    for _ in range(n - 1):
        logits = ex.execute([BatchEntry(seq_id=i, tokens=(last[i],), start_pos=pos, block_table=())
                             for i in range(batch)])
        last = [int(row.argmax()) for row in logits]
        pos += 1
    dt = time.perf_counter() - t0
    ex.close()
    return batch * (n - 1) / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--weights", nargs="+", default=["dequantized", "quantized"])
    ap.add_argument("--kv-cache", default="float", choices=["float", "quantized"])
    args = ap.parse_args()
    path = embedded_model_path()
    print(json.dumps(machine_info(), default=str))
    print(f"model {path.name}  device {'metal' if mx.metal.is_available() else 'cpu'}  "
          f"tokens {args.tokens}  runs {args.runs}  kv_cache {args.kv_cache}")
    print(cpu_blas.status)
    for mode in args.weights:
        backend = MlxBackend.load(ModelSource.from_path(path),
                                  {"weights": mode, "kv_cache": args.kv_cache, "context_length": 1024})
        ids = backend.tokenizer.encode(PROMPT)
        one = [single_stream(backend, ids, args.tokens) for _ in range(args.runs)]
        many = [batched(backend, ids, args.batch, args.tokens) for _ in range(args.runs)]
        s1, sb = statistics.median(one), statistics.median(many)
        print(f"weights={mode:<12} single-stream {s1:6.2f} tok/s   C={args.batch} aggregate {sb:6.2f} tok/s"
              f"   ratio {sb / s1:4.2f}x")
        print(f"  runs: single {[round(x, 2) for x in one]}  batched {[round(x, 2) for x in many]}")
        backend.close()


if __name__ == "__main__":
    main()
