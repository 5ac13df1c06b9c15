"""Teacher-forced agreement of each backend with llama.cpp on the embedded model.

    .venv/bin/python benchmarks/parity_vs_llamacpp.py --tokens 32

For the 8 prompts of ``ruvllm.testing.parity.PROMPTS``, both engines are fed llama.cpp's greedy
continuation and their top-1 choices are compared at every position (see that module for why
teacher forcing, and what a "near-tie" is). Prints, per backend configuration: agreement, the
widest llama.cpp margin at a disagreement, and the identical free-running greedy prefix per
prompt. Not timing-sensitive: a busy machine gives the same figures, only later.
"""

from __future__ import annotations

import argparse

import numpy as np
from ruvllm.models import ModelSource
from ruvllm.registry import embedded_model_path
from ruvllm.testing.parity import PROMPTS, LlamaCppReference, teacher_forced


def candle_like_logits(dtype: str, **options: object):
    import torch
    from ruvllm_candle_like.backend import CandleLikeBackend

    source = ModelSource.from_path(embedded_model_path())
    backend = CandleLikeBackend.load(source, {"dtype": dtype, **options})

    @torch.inference_mode()
    def logits(sequence: list[int], first: int) -> np.ndarray:
        cache = backend.new_cache(len(sequence))
        cache.begin(len(sequence))
        dev = backend.device
        rows = torch.arange(first, len(sequence), device=dev)
        ids = torch.tensor(sequence, device=dev)
        out = backend.model.forward(ids, torch.arange(len(sequence), device=dev), cache, rows)
        return out.numpy()

    return backend, logits


def mlx_logits():
    from ruvllm_mlx.backend import MlxBackend
    from ruvllm_mlx.model import Segment

    backend = MlxBackend.load(ModelSource.from_path(embedded_model_path()), {"context_length": 2048})

    def logits(sequence: list[int], first: int) -> np.ndarray:
        cache = backend.model.new_cache()
        rows = list(range(first, len(sequence)))
        return np.array(backend.model.forward(sequence, [Segment(cache, 0, len(sequence))], rows))

    return backend, logits


TARGETS = {
    "candle_like float32": lambda: candle_like_logits("float32", int4_weights=False),
    "candle_like bfloat16": lambda: candle_like_logits("bfloat16", int4_weights=False),
    # The GGUF's own blocks at every row (the default where the native kernel runs).
    "candle_like int4": lambda: candle_like_logits("float32", int4_weights=True, dense_weights=False),
    "mlx": mlx_logits,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated: {', '.join(TARGETS)}")
    args = ap.parse_args()
    reference = LlamaCppReference(embedded_model_path())
    for name in args.targets.split(","):
        backend, logits = TARGETS[name]()
        prompts = [backend.tokenizer.encode(p, parse_special=True) for p in PROMPTS]
        report = teacher_forced(reference, prompts, logits, args.tokens)
        print(f"{name}: {report.summary()}", flush=True)
        for d in report.disagreements:
            print(f"    prompt {d.prompt} position {d.position}: llama.cpp {d.want} vs {d.got}, "
                  f"llama.cpp margin {d.margin:.3f}")
        backend.close()
    reference.close()


if __name__ == "__main__":
    main()
