"""The upper bound SONA's online loop approaches: an offline LoRA of the same rank, layers and
targets, fine-tuned on the same rated examples with the same loss, for several passes, with
nothing else in the way (no EWC++, no replay limit, every example seen ``epochs`` times)."""

from __future__ import annotations

import random

import torch
from ruvllm.types import Trajectory
from ruvllm_candle_like.lora import LoraAdapter
from ruvllm_sona.micro_lora import MicroLora, to_adapter
from ruvllm_sona.options import SonaOptions
from ruvllm_sona.trainer import Example, train_step, training_dtype


def offline_adapter(backend, options: SonaOptions, rated: list[tuple[Trajectory, float]], *, epochs: int,
                    name: str) -> LoraAdapter:
    """Fine-tune a fresh MicroLoRA on ``rated`` (trajectory, score) pairs; the served adapter."""
    model = backend.model.cast(training_dtype(options.dtype, backend.model))
    micro = MicroLora(model.cfg, rank=options.rank, alpha=options.alpha, targets=options.targets,
                      seed=options.seed, layers=options.layers)
    optimizer = torch.optim.Adam(micro.parameters(), lr=options.learning_rate)
    examples = [Example(t.prompt_ids, t.output_ids, score) for t, score in rated if t.output_ids]
    rng = random.Random(options.seed)
    for _ in range(epochs):
        rng.shuffle(examples)
        for i in range(0, len(examples), options.batch_size):
            train_step(model, micro, optimizer, examples[i:i + options.batch_size], options.max_seq_len)
    served = backend.model
    return to_adapter(name, model.cfg, micro.delta(), dtype=served.dtype, device=served.device)
