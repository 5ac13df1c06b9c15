"""EWC++: elastic weight consolidation with an online Fisher estimate.

The penalty ``lambda/2 * sum F (theta - theta*)^2`` keeps the adapter's parameters near the
anchor ``theta*`` in the directions that matter for what the model already does. ``F`` is a
diagonal Fisher estimate from real gradients: squared gradients of the log-likelihood of the
model's own served outputs (samples of its distribution, so this is the true Fisher, not the
empirical one), blended online as EWC++ does (``F <- decay F + (1 - decay) F_new``). The
Fisher is kept unnormalised: it scales with the squared gradients, so the penalty's pull stays
commensurate with the task loss's gradients whatever their size. The deep loop moves the anchor
and keeps the Fisher (:meth:`EwcPlusPlus.rebase`).
"""

from __future__ import annotations

import torch


class EwcPlusPlus:
    def __init__(self, params: list[torch.Tensor], *, strength: float, decay: float):
        self.params = params
        self.strength = strength
        self.decay = decay
        self.fisher = [torch.zeros_like(p) for p in params]
        self.anchor = [p.detach().clone() for p in params]
        self.updates = 0

    def observe(self, grads: list[torch.Tensor | None]) -> None:
        """Blend one estimate (squared gradients of one micro-batch) into the Fisher."""
        first = self.updates == 0
        for f, g in zip(self.fisher, grads, strict=True):
            sq = torch.zeros_like(f) if g is None else g.detach().float() ** 2
            if first:
                f.copy_(sq)
            else:
                f.mul_(self.decay).add_(sq, alpha=1.0 - self.decay)
        self.updates += 1

    def penalty(self) -> torch.Tensor:
        if self.updates == 0 or self.strength == 0:
            return torch.zeros(())
        total = torch.zeros(())
        for p, f, a in zip(self.params, self.fisher, self.anchor, strict=True):
            total = total + (f * (p - a) ** 2).sum()
        return 0.5 * self.strength * total

    def rebase(self, params: list[torch.Tensor]) -> None:
        """Guard ``params`` (a restarted MicroLoRA of the same shapes) from their current values,
        keeping the running Fisher.

        After a deep consolidation the anchor is the consolidated model, which is the new
        MicroLoRA's no-op start, and what mattered before still matters: EWC++'s Fisher is a
        running estimate over everything learned, never restarted. Restarting it left the first
        step after every consolidation unguarded, and the drift added up over consolidations
        (benchmarks/sona_dev.py, lambda 1e6: +3.6 % after 3 rounds, +15 % after 5).
        """
        for f, p in zip(self.fisher, params, strict=True):
            if f.shape != p.shape:
                raise ValueError(f"a rebased parameter has shape {tuple(p.shape)}, its Fisher "
                                 f"{tuple(f.shape)}")
        self.params = params
        self.anchor = [p.detach().clone() for p in params]
