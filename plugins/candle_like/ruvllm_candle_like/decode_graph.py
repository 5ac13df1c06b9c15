"""The executor's small decode steps as one compiled graph (``compile_decode``).

At a few rows a decode step is not its matmuls: on the 2-core AVX2 kind with int4 weights, one
row's 120 projections and the head took ~25 of ~34 ms (one thread) and the rest was ~600 small
ops a step (RMSNorm, RoPE, casts around the int4 kernel, the KV store and gather, SDPA), each
paying the dispatcher and Python. ``torch.compile`` (inductor, as gpt-fast does) of the whole
layer stack, from the embedding to the final norm, fuses the element-wise ops into a few C++
kernels and calls the rest (the int4 kernel, SDPA, the KV index ops) from one wrapper. Compiling
smaller pieces does not pay: one compiled call costs ~55 us here, more than the ops it fuses.

What runs in the graph is the model's own ``Transformer.hidden`` over the executor's own
attention plan, traced; only the head stays outside (oneDNN's packed weight is opaque to the
compiler). The graph covers steps of decode entries only (prefill chunks, LoRA rows, the
two-tier cache and the batch-invariant mode run eagerly) of fewer rows than the int4
projections' ``dense_rows``, on a model whose layer projections are all int4.

The matmuls and attention are the same kernels, and inductor computes each element-wise op in
float32 as eager does; it reduces RMSNorm's sum of squares in another order where it fuses the
norm with the residual add, though (a last-bit difference), and a last bit can flip the bf16
rounding of an int4 projection's input. So the logits are not eager's bit for bit: on the
embedded model (float32, 12 decode steps at 1-4 rows) they moved by at most 0.31, the greedy
tokens stayed the same, and the tests hold the graph to the near-tie rule against eager.

Shapes: the row count is static at 1 and dynamic from 2 on (where the attention mask is always
passed), the gathered context length is dynamic, so two graphs serve every covered step.
:meth:`DecodeGraph.warm` compiles them when the executor is created, so the time lands on
start-up (logged and in the executor's description), never on a request: after it, a step no
graph serves runs eagerly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from ruvllm_candle_like.model import Attention, Transformer
from ruvllm_candle_like.projection import PROJECTIONS, BlockProjection

log = logging.getLogger(__name__)


def unsupported(model: Transformer) -> str | None:
    """Why ``model``'s decode steps cannot run as a compiled graph, or None when they can."""
    dense = [f"layer {i} {name}" for i, layer in enumerate(model.layers) for name in PROJECTIONS
             if not isinstance(getattr(layer, name), BlockProjection)]
    if dense:
        # A dense projection's oneDNN-packed weight cannot be traced.
        return f"{len(dense)} layer projections are dense (first: {dense[0]}); the graph needs int4 weights"
    return None


class DecodeGraph:
    """``model.hidden`` compiled for decode steps of 1 .. :attr:`max_rows` rows."""

    def __init__(self, model: Transformer, max_sequences: int):
        #: At most the executor's sequences, and below the row count from which an int4
        #: projection takes its dense (packed) copy.
        self.max_rows = min([max_sequences] + [getattr(layer, name).dense_rows - 1 for layer in model.layers
                                               for name in PROJECTIONS])
        self._hidden: Callable[..., torch.Tensor] = torch.compile(model.hidden, fullgraph=True)
        #: Why the graph is off after a failed compile (then every step runs eagerly).
        self.failed: str | None = None
        #: Seconds :meth:`warm` took (compiling, or finding the graphs already compiled).
        self.warm_seconds = 0.0
        #: torch.compiler's stance for a step: compile while warming; after it, a step no graph
        #: serves (a guard nothing here foresaw) runs eagerly rather than compile on a request.
        self.stance = "default"

    def describe(self) -> str:
        if self.failed is not None:
            return f"compile_decode off ({self.failed})"
        return f"decode steps of 1-{self.max_rows} rows compiled (compile_decode, {self.warm_seconds:.1f} s)"

    def covers(self, rows: int, longest: int) -> bool:
        """A decode-only step of ``rows`` rows whose longest sequence holds ``longest`` positions.

        One position would specialise the dynamic length to 1 (a new graph): such a step (a
        one-token prompt) runs eagerly."""
        return self.failed is None and 1 <= rows <= self.max_rows and longest >= 2

    def hidden(self, tokens: torch.Tensor, positions: torch.Tensor, plan: Attention,
               dynamic: list[tuple[torch.Tensor, tuple[int, ...]]]) -> torch.Tensor:
        """The final hidden state of every row; ``dynamic`` names the step tensors' row and
        length dimensions, marked dynamic so that new lengths and row counts reuse the graphs."""
        for tensor, dims in dynamic:
            for dim in dims:
                # A size-1 dimension (one row) cannot be dynamic: it stays static.
                if tensor.shape[dim] > 1:
                    torch._dynamo.mark_dynamic(tensor, dim)
        with torch.compiler.set_stance(self.stance):
            return self._hidden(tokens, positions, plan)

    def warm(self, step: Callable[[int], None]) -> None:
        """Compile every graph now: ``step(rows)`` runs one covered decode step of ``rows`` rows.
        A failure (no C++ compiler, an op inductor rejects) is logged and leaves the eager path."""
        t0 = time.perf_counter()
        try:
            for rows in range(1, min(self.max_rows, 2) + 1):
                step(rows)
        except Exception as exc:  # any compiler failure: serve eagerly rather than not at all
            text = str(exc).strip()
            self.failed = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
            log.warning("candle_like: compile_decode is off, compiling the decode step failed (%s); "
                        "decode steps run eagerly", self.failed)
            return
        self.warm_seconds = time.perf_counter() - t0
        self.stance = "eager_on_recompile"
        log.info("candle_like: %s", self.describe())
