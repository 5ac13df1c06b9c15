"""MicroLoRA: the small trainable adapter the background loop updates, and the consolidated
base LoRA the deep loop folds it into.

Trainable parameters are float32 masters (A random, B zero, as LoRA starts: the adapter is an
exact no-op until trained). ``as_plan`` builds a differentiable :class:`LoraPlan` in the
model's dtype for training; ``freeze`` builds the immutable adapter the engine serves.
"""

from __future__ import annotations

import math

import torch
from ruvllm_candle_like.config import ModelConfig
from ruvllm_candle_like.lora import (
    LoraAdapter,
    LoraPair,
    LoraPlan,
    build_adapter,
    projection_shapes,
    site_slices,
)

#: (layer, projection) -> (A [r, in], B [out, r]) with the scale folded into B.
Pairs = dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


class MicroLora:
    def __init__(self, cfg: ModelConfig, *, rank: int, alpha: float, targets: tuple[str, ...],
                 seed: int = 0, layers: int = 0):
        """``layers``: adapt only the last ``layers`` layers (0: all). The backward pass stops at
        the first adapted layer, so training the last 8 of 30 costs about half a full step."""
        self.cfg = cfg
        self.rank = rank
        self.alpha = alpha
        self.targets = targets
        shapes = projection_shapes(cfg)
        self.cols = site_slices(cfg)
        g = torch.Generator().manual_seed(seed)
        self.a: dict[tuple[int, str], torch.Tensor] = {}
        self.b: dict[tuple[int, str], torch.Tensor] = {}
        first = cfg.num_layers - layers if 0 < layers < cfg.num_layers else 0
        for layer in range(first, cfg.num_layers):
            for module in targets:
                out_f, in_f = shapes[module]
                # Kaiming-uniform A as PEFT initialises it; B = 0 makes the start a no-op.
                bound = 1.0 / math.sqrt(in_f)
                a = (torch.rand(rank, in_f, generator=g) * 2 - 1) * bound
                self.a[(layer, module)] = a.requires_grad_(True)
                self.b[(layer, module)] = torch.zeros(out_f, rank, requires_grad=True)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def parameters(self) -> list[torch.Tensor]:
        return [t for k in self.a for t in (self.a[k], self.b[k])]

    def as_plan(self, dtype: torch.dtype) -> LoraPlan:
        """A plan over every row whose tensors stay in the autograd graph."""
        pairs = {k: LoraPair(a=self.a[k].to(dtype), b=self.b[k].to(dtype), cols=self.cols[k[1]])
                 for k in self.a}
        adapter = LoraAdapter(name="<training>", rank=self.rank, alpha=self.alpha, targets=self.targets,
                              pairs=pairs)
        return LoraPlan([(adapter, None)])

    def delta(self) -> Pairs:
        """(A, B * scale) per projection, detached: the update as a scale-1 low-rank pair."""
        return {k: (self.a[k].detach().clone(), self.b[k].detach() * self.scale) for k in self.a}

    def norm(self) -> float:
        """Frobenius norm of the weight update it makes (sum over projections)."""
        return math.sqrt(sum(float(((b @ a) ** 2).sum()) for a, b in self.delta().values()))

    def reset(self) -> None:
        """Back to a no-op (B = 0), keeping A."""
        with torch.no_grad():
            for b in self.b.values():
                b.zero_()


def combine(parts: list[Pairs]) -> Pairs:
    """Stack scale-1 low-rank pairs: sum_i B_i A_i == [B_1 .. B_n] [A_1; ..; A_n] exactly."""
    out: Pairs = {}
    for key in {k for p in parts for k in p}:
        pieces = [p[key] for p in parts if key in p]
        out[key] = (torch.cat([a for a, _ in pieces], dim=0), torch.cat([b for _, b in pieces], dim=1))
    return out


def truncate(pairs: Pairs, rank: int) -> Pairs:
    """Best rank-``rank`` approximation (SVD) of each projection's summed update."""
    out = {}
    for key, (a, b) in pairs.items():
        if a.shape[0] <= rank:
            out[key] = (a, b)
            continue
        # SVD of the small factors avoids forming the full [out, in] matrix's decomposition.
        qa, ra = torch.linalg.qr(a.T)  # a.T = qa ra, qa [in, k]
        qb, rb = torch.linalg.qr(b)  # b = qb rb, qb [out, k]
        u, s, vh = torch.linalg.svd(rb @ ra.T)
        u, s, vh = u[:, :rank], s[:rank], vh[:rank]
        root = s.sqrt()
        out[key] = ((root[:, None] * vh) @ qa.T, (qb @ u) * root[None, :])
    return out


def to_adapter(name: str, cfg: ModelConfig, pairs: Pairs, *, dtype: torch.dtype,
               device: torch.device) -> LoraAdapter:
    """A servable adapter from scale-1 pairs (rank = alpha, so W' = W + B A)."""
    rank = max(a.shape[0] for a, _ in pairs.values())
    padded = {}
    for key, (a, b) in pairs.items():
        if a.shape[0] < rank:  # PEFT needs one rank for every projection: pad with zeros
            a = torch.cat([a, a.new_zeros(rank - a.shape[0], a.shape[1])])
            b = torch.cat([b, b.new_zeros(b.shape[0], rank - b.shape[1])], dim=1)
        padded[key] = (a, b)
    return build_adapter(name, cfg, rank, float(rank), padded, dtype=dtype, device=device)
