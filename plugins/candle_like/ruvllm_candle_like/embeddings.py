"""Sentence embeddings from the transformer's final hidden states (``/v1/embeddings``).

A batch of whole inputs runs through :meth:`Transformer.hidden` (no LM head, no KV cache kept,
no LoRA adapter: embeddings are the base model's) in one forward pass. The projections and MLPs
see the inputs packed back to back, so no work is spent on padding there; only attention pads
them to ``[B, L]`` with a causal, per-input mask, so no token ever sees another input. The
vector of an input is the mean of its tokens' normed hidden states, L2-normalised.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ruvllm_candle_like.model import Transformer


class PaddedBatchAttention:
    """:class:`~ruvllm_candle_like.model.Attention` over whole inputs packed in one flat batch.

    Rows of input ``b`` are scattered into a zero-padded ``[B, L]`` layout, attended with a
    mask that is causal within the input and hides the padding, and gathered back.
    """

    def __init__(self, lengths: Sequence[int], device: torch.device):
        self.batch = len(lengths)
        self.width = max(lengths)
        lens = torch.tensor(list(lengths), device=device)
        cols = torch.arange(self.width, device=device)
        valid = cols.unsqueeze(0) < lens.unsqueeze(1)  # [B, L]
        #: Flat row i of the packed batch -> its slot in the padded [B * L] layout.
        self.slots = valid.flatten().nonzero().squeeze(1)
        self.mask: torch.Tensor | None = None
        if self.batch > 1:  # one input alone needs no mask (and a long one would make a big one)
            causal = cols.unsqueeze(1) >= cols.unsqueeze(0)  # [L(query), L(key)]
            # Padded query rows still see their input's keys, so no row of the mask is all False
            # (which would give NaN); those rows are dropped on the way back anyway.
            self.mask = (causal.unsqueeze(0) & valid.unsqueeze(1)).unsqueeze(1)  # [B, 1, L, L]

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        """[T, H, D] packed -> [B, H, L, D] padded."""
        padded = x.new_zeros((self.batch * self.width, *x.shape[1:]))
        padded[self.slots] = x
        return padded.view(self.batch, self.width, *x.shape[1:]).transpose(1, 2)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        h, d = q.shape[1], q.shape[2]
        if self.mask is None:  # one input: nothing to pad or hide, plain causal attention
            q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # [1, heads, T, D]
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=h != k.shape[1])
            return out[0].transpose(0, 1).reshape(q.shape[2], h * d)
        out = F.scaled_dot_product_attention(self._pad(q), self._pad(k), self._pad(v), attn_mask=self.mask,
                                             enable_gqa=h != k.shape[1])
        return out.transpose(1, 2).reshape(self.batch * self.width, h * d)[self.slots]


def token_batches(inputs: Sequence[Sequence[int]], max_tokens: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` runs of ``inputs`` whose padded size (count x longest) stays within
    ``max_tokens``; an input longer than that on its own forms a run by itself."""
    start, longest = 0, 0
    for i, ids in enumerate(inputs):
        wider = max(longest, len(ids))
        if i > start and wider * (i + 1 - start) > max_tokens:
            yield start, i
            start, wider = i, len(ids)
        longest = wider
    if start < len(inputs):
        yield start, len(inputs)


@torch.inference_mode()
def mean_pooled(model: Transformer, inputs: Sequence[Sequence[int]], *, max_batch_tokens: int) -> np.ndarray:
    """Mean of each input's final hidden states, float32 ``[len(inputs), hidden]`` (not normalised).

    Inputs go through in runs of at most ``max_batch_tokens`` padded tokens (the attention
    scores of a run take ``B x heads x L x L`` elements), each run one forward pass.
    """
    device = model.device
    out = np.empty((len(inputs), model.cfg.hidden_size), dtype=np.float32)
    for start, end in token_batches(inputs, max_batch_tokens):
        run = inputs[start:end]
        lengths = [len(ids) for ids in run]
        tokens = torch.tensor([t for ids in run for t in ids], dtype=torch.long, device=device)
        positions = torch.cat([torch.arange(n, device=device) for n in lengths])
        hidden = model.hidden(tokens, positions, PaddedBatchAttention(lengths, device)).float()
        owner = torch.repeat_interleave(torch.arange(len(run), device=device),
                                        torch.tensor(lengths, device=device))
        sums = torch.zeros((len(run), hidden.shape[1]), dtype=torch.float32, device=device)
        sums.index_add_(0, owner, hidden)
        out[start:end] = (sums / torch.tensor(lengths, device=device).unsqueeze(1)).cpu().numpy()
    return out
