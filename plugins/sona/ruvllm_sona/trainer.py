"""The background loop's gradient step: reward-weighted log-likelihood through the same
Transformer forward that serves, with the MicroLoRA in the autograd graph.

For a response ``y`` to prompt ``x`` with score ``r``:

- ``r > 0``: ``r * -mean_t log p(y_t | x, y_<t)`` (make the rated response more likely);
- ``r < 0``: ``|r| * -mean_t log(1 - p(y_t | ...))`` (unlikelihood: make it less likely, with
  a loss that stays bounded, unlike ``-|r| * log p``).

Several sequences run as one flat token list (the model's native layout) with a causal
attention per sequence and no KV cache, so one forward/backward covers a whole batch.

The step computes in :func:`training_dtype`: bf16's backward on a CPU without native bf16 fell
to torch's single-threaded reference gemm (a 2-minute run took over 20), so there it trains in
float32 even when the served model is bf16.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import torch
import torch.nn.functional as F
from ruvllm.errors import OptionError
from ruvllm_candle_like.attention_ops import attend_sequence
from ruvllm_candle_like.cpu_dtype import fast_cpu_dtype, native_on, warn_if_slow
from ruvllm_candle_like.lora import LoraPlan
from ruvllm_candle_like.model import Transformer

from ruvllm_sona.micro_lora import MicroLora

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def training_dtype(name: str, model: Transformer) -> torch.dtype:
    """The dtype training computes in for option ``dtype = name`` (see SonaOptions.dtype).

    auto keeps the served model's dtype wherever this device computes it natively (no copy of
    the weights) and otherwise takes the CPU's fast dtype; an explicit bf16 there is honoured
    after one warning naming the missing CPU feature and the cost.
    """
    if name == "auto":
        return model.dtype if native_on(model.dtype, model.device) else fast_cpu_dtype()
    dtype = DTYPES[name]
    if model.device.type == "cpu" and dtype == torch.float16:
        raise OptionError("sona", "dtype", "float16 is slow and poorly supported on CPU", name,
                          fix="use auto, bfloat16 or float32")
    warn_if_slow(dtype, model.device, "sona training")
    return dtype


@attrs.frozen
class Example:
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    weight: float = 1.0


class PackedCausalAttention:
    """Causal attention within each packed sequence; keys/values are this step's only."""

    def __init__(self, spans: Sequence[tuple[int, int]]):
        self.spans = spans

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        outs = [attend_sequence(q[s:e], k[s:e].transpose(0, 1), v[s:e].transpose(0, 1), 0)
                for s, e in self.spans]
        return torch.cat(outs, dim=0)


def pack(examples: Sequence[Example], device: torch.device, max_len: int):
    """Flat tokens/positions, per-sequence spans, and (row, target, example) triples for the
    response tokens (the row whose logits predict each response token)."""
    tokens: list[int] = []
    positions: list[int] = []
    spans = []
    rows, targets, owners = [], [], []
    for i, ex in enumerate(examples):
        seq = (ex.prompt + ex.output)[-max_len:]
        n_out = min(len(ex.output), len(seq) - 1)
        start = len(tokens)
        tokens.extend(seq)
        positions.extend(range(len(seq)))
        spans.append((start, start + len(seq)))
        for j in range(len(seq) - n_out, len(seq)):
            rows.append(start + j - 1)
            targets.append(seq[j])
            owners.append(i)
    as_t = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
    return as_t(tokens), as_t(positions), spans, as_t(rows), as_t(targets), as_t(owners)


def token_logprobs(model: Transformer, examples: Sequence[Example], lora: LoraPlan | None,
                   max_len: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """log p of every response token under the model (+ ``lora``), and which example it is in."""
    tokens, positions, spans, rows, targets, owners = pack(examples, model.device, max_len)
    logits = model.forward(tokens, positions, PackedCausalAttention(spans), rows, lora)
    logp = F.log_softmax(logits, dim=-1).gather(1, targets[:, None]).squeeze(1)
    return logp, owners


def reward_loss(logp: torch.Tensor, owners: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Mean over examples of the reward-weighted (un)likelihood of their response tokens."""
    n = weights.shape[0]
    w = weights[owners]
    pos = -logp
    # log(1 - p), clamped so a token already at p ~ 1 gives a large but finite push.
    neg = -torch.log1p(-logp.exp().clamp(max=1 - 1e-4))
    per_token = torch.where(w >= 0, w * pos, -w * neg)
    counts = torch.bincount(owners, minlength=n).clamp_min(1).to(per_token.dtype)
    per_example = torch.zeros(n, dtype=per_token.dtype).index_add(0, owners, per_token) / counts
    return per_example.sum() / max(int((weights != 0).sum()), 1)


def train_step(model: Transformer, micro: MicroLora, optimizer: torch.optim.Optimizer,
               examples: Sequence[Example], max_len: int, penalty: Callable[[], torch.Tensor] | None = None,
               ) -> tuple[float, float]:
    """One Adam step of the MicroLoRA on ``examples`` (plus ``penalty()``, EWC++'s): the online
    loop's step, and the offline fine-tune's (benchmarks) on the same loss. Returns (loss, penalty)."""
    weights = torch.tensor([e.weight for e in examples], dtype=torch.float32)
    logp, owners = token_logprobs(model, examples, micro.as_plan(model.dtype), max_len)
    loss = reward_loss(logp.float(), owners, weights)
    pen = penalty() if penalty is not None else torch.zeros(())
    optimizer.zero_grad(set_to_none=True)
    (loss + pen).backward()
    torch.nn.utils.clip_grad_norm_(micro.parameters(), 1.0)
    optimizer.step()
    return loss.item(), pen.item()


def perplexity(model: Transformer, token_ids: Sequence[int], lora: LoraPlan | None,
               window: int = 256) -> float:
    """Perplexity of a text (token ids) in windows of ``window`` tokens."""
    total, count = 0.0, 0
    with torch.inference_mode():
        for start in range(0, max(len(token_ids) - 1, 1), window):
            chunk = tuple(token_ids[start:start + window + 1])
            if len(chunk) < 2:
                break
            logp, _ = token_logprobs(model, [Example(chunk[:1], chunk[1:])], lora, max_len=window + 1)
            total += float(-logp.float().sum())
            count += logp.shape[0]
    return float(torch.tensor(total / max(count, 1)).exp())
