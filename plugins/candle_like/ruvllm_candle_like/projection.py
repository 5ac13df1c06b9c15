"""A projection weight plus, on CPU, a copy pre-packed in oneDNN's blocked layout.

``F.linear`` on a plain ``[out, in]`` CPU weight lets oneDNN bring the weight into its blocked
layout on every call; packing once at load (the layout torch inductor's freezing pass feeds
oneDNN) measured on this 2-core x86-64 CPU, the 30 layers of SmolLM2-135M in bfloat16: the
batch-1 matmuls 1.5x faster and the 16-row ones 1.6x faster, the same greedy tokens. The packed
copy has no autograd formula, so a call that needs a gradient through its input (SONA training)
takes the plain weight; the plain weight also stays the one every other reader (LoRA, tests,
writers) sees.

Packing does not apply everywhere: oneDNN packs no bf16 weights on a CPU without native bf16
(AVX2 only, or ``ONEDNN_MAX_CPU_ISA`` below AVX512_CORE_BF16), and a torch build may lack the
op. :func:`packing_unavailable` finds that out once per dtype, so the model's projections fall
back to plain matmuls together and the backend can say so (a log line and a capabilities note)
instead of every projection failing on its own.
"""

from __future__ import annotations

import functools
from typing import Protocol

import torch
import torch.nn.functional as F

from ruvllm_candle_like import cpu_dtype

#: The dtypes oneDNN's linear-weight packing handles at all.
PACKABLE = (torch.float32, torch.bfloat16)


@functools.cache
def packing_unavailable(dtype: torch.dtype) -> str | None:
    """Why oneDNN cannot pack CPU weights of ``dtype`` here, or None when it can.

    Asked of oneDNN itself (a tiny weight is packed once per dtype and process): its answer
    depends on the ISA it dispatches to, which only it knows for sure.
    """
    if dtype not in PACKABLE:
        return "oneDNN packs only float32 and bfloat16 weights"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN"
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype), 1)
    except (RuntimeError, AttributeError) as exc:  # the ISA lacks the kernels, or the op is missing
        text = str(exc).strip()
        reason = text.splitlines()[0] if text else type(exc).__name__
        missing = cpu_dtype.cpu_info().bf16_missing() if dtype == torch.bfloat16 else None
        return f"{missing} (oneDNN: {reason})" if missing else f"oneDNN: {reason}"
    return None


def unpacked_note(dtype: torch.dtype) -> str | None:
    """One sentence for logs and capabilities notes when ``prepack_weights`` cannot apply to
    ``dtype`` on this CPU, or None when it can."""
    why = packing_unavailable(dtype)
    if why is None:
        return None
    return (f"prepack_weights has no effect for {str(dtype).removeprefix('torch.')} on this CPU, the "
            f"projections run plain matmuls: {why}")


def pack_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's packed copy of ``weight``, or None where the platform offers none."""
    if weight.device.type != "cpu" or packing_unavailable(weight.dtype) is not None:
        return None
    # The batch-size hint only picks the blocking; every row count is served correctly.
    return torch.ops.mkldnn._reorder_linear_weight(weight, 1)


class Projection:
    """``x @ weight.T + bias`` through the fastest kernel the weight's platform offers."""

    __slots__ = ("bias", "packed", "weight")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, prepack: bool = True):
        self.weight = weight
        self.bias = bias
        self.packed = pack_weight(weight) if prepack else None

    @property
    def shape(self) -> torch.Size:
        """``[out, in]``."""
        return self.weight.shape

    @property
    def held(self) -> str:
        """How the weights are held, for the serve banner."""
        return "dense " + str(self.weight.dtype).removeprefix("torch.")

    def nbytes(self) -> int:
        """Resident bytes: the weight plus its packed copy, if any."""
        return tensor_bytes(self.weight) + (0 if self.packed is None else tensor_bytes(self.packed))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None or (x.requires_grad and torch.is_grad_enabled()):
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


#: A layer's projections, by attribute name, in csrc/decoder.cpp's Layer order: what twins, the
#: compiled graph, counts and the native decoder walk.
PROJECTIONS = ("qkv", "o", "gate_up", "down")


class QuantizedKernel(Protocol):
    """Block-quantised weights ``[out, in]`` and the kernel that multiplies by them:
    :class:`~ruvllm_candle_like.blockmm.BlockWeights` (ruvllm's own) or
    :class:`~ruvllm_candle_like.int4.PackedInt4` (torch's, where ruvllm's cannot run)."""

    @property
    def shape(self) -> tuple[int, int]: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def held(self) -> str:
        """How it holds the weights, for the serve banner."""
        ...

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ w.T`` (float32 or bfloat16, by kernel)."""
        ...

    def dequantize(self) -> torch.Tensor:
        """The float32 weights the kernel computes with."""
        ...


class BlockProjection:
    """A projection on block-quantised weights, plus optionally a dense copy for steps of many rows.

    At a few rows a step is bound by the bytes of weights it reads, and 4-bit codes are a fifth
    of float32's. At many rows torch's int4 kernel costs more than a dense matmul; ruvllm's own
    (blockmm.py) about as much as float32's, while bfloat16 on AMX still beats it (the crossover
    on this project's CPUs is in docs/backends/candle_like.md). So with a ``dense`` copy, a call
    of at least ``dense_rows`` rows takes it. Without one, every call runs the quantised kernel
    and the weights cost about the GGUF's bytes.
    """

    __slots__ = ("bias", "dense", "dense_rows", "kernel", "out_dtype")

    def __init__(self, kernel: QuantizedKernel, bias: torch.Tensor | None, *, dtype: torch.dtype,
                 dense: torch.Tensor | None = None, dense_rows: int = 1 << 62):
        """``dense``: the weight in ``dtype`` (plain, or oneDNN-packed where packing applies)."""
        self.kernel = kernel
        self.bias = bias
        self.out_dtype = dtype
        self.dense = dense
        self.dense_rows = dense_rows

    @property
    def shape(self) -> torch.Size:
        """``[out, in]``."""
        return torch.Size(self.kernel.shape)

    @property
    def weight(self) -> torch.Tensor:
        """The dense copy's weights, or else those the kernel computes with, in the model's
        dtype (either read back through its kernel on an identity: exact).

        Built on each access, for readers that need a plain matrix (SONA's training copy, the
        gradient path): no plain copy stays resident."""
        if self.dense is not None:
            return self._dense(torch.eye(self.shape[1], dtype=self.out_dtype)).T.contiguous()
        return self.kernel.dequantize().to(self.out_dtype)

    @property
    def held(self) -> str:
        """How the weights are held, for the serve banner."""
        return self.kernel.held if self.dense is None else self.kernel.held + " + dense copy"

    def nbytes(self) -> int:
        """Resident bytes: the blocks plus the dense copy, if any."""
        return self.kernel.nbytes + (0 if self.dense is None else tensor_bytes(self.dense))

    def kernel_only(self) -> BlockProjection:
        """This projection without its dense copy: one kernel at every row count."""
        return BlockProjection(self.kernel, self.bias, dtype=self.out_dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad and torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        if self.dense is not None and x.shape[0] >= self.dense_rows:
            return self._dense(x, self.bias)
        y = self.kernel.matmul(x).to(self.out_dtype)
        return y if self.bias is None else y + self.bias

    def _dense(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        assert self.dense is not None
        if self.dense.is_mkldnn:
            return torch.ops.mkldnn._linear_pointwise(x, self.dense, bias, "none", [], "")
        return F.linear(x, self.dense, bias)


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s elements, oneDNN-packed tensors included."""
    # An mkldnn tensor has no storage torch can measure; it holds the same elements.
    return t.numel() * t.element_size()
