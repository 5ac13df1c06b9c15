"""The model's layer stack in one native call (``csrc/decoder.cpp``).

On PyTorch a layer is ~20 small ops (norms, RoPE, slices, SiLU, residual adds), each paying the
dispatcher and an allocation: at one decode row on the 2-core AVX2 kind that was ~8 of a ~15 ms
step, as much as the matmuls themselves. The native decoder runs those in place in buffers
allocated once per call and calls the block kernel (blockmm.py) and the pool attention
(paged_attention.py) in between; what only the runtime can do (another KV layout's attention,
long prompt chunks' SDPA, LoRA deltas) it hands back through a callback at that point of the
layer.

It serves a :class:`~ruvllm_candle_like.model.Transformer` whose projections all run on the
block kernel in float32 (the default for GGUF models where the kernel runs, options.py);
:func:`unavailable` says why any other model keeps the PyTorch path.
"""

from __future__ import annotations

import ctypes
import functools
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ruvllm_candle_like import blockmm, native
from ruvllm_candle_like.blockmm import PANEL, BlockWeights
from ruvllm_candle_like.lora import LoraPlan
from ruvllm_candle_like.paged_attention import PoolRows
from ruvllm_candle_like.projection import PROJECTIONS, BlockProjection

if TYPE_CHECKING:
    from ruvllm_candle_like.model import Attention, Layer, Transformer

_POINTER = ctypes.c_void_p
_I64 = ctypes.c_int64


class _Projection(ctypes.Structure):
    _fields_ = [("codes", _POINTER), ("scale", _POINTER), ("offset", _POINTER), ("bias", _POINTER),
                ("n", _I64), ("k", _I64), ("bits", _I64), ("scale_format", _I64), ("int8", _I64)]


class _Layer(ctypes.Structure):
    _fields_ = [("ln1", _POINTER), ("ln2", _POINTER), ("qkv", _Projection), ("o", _Projection),
                ("gate_up", _Projection), ("down", _Projection)]


class _Model(ctypes.Structure):
    _fields_ = [("num_layers", _I64), ("hidden", _I64), ("heads", _I64), ("kv_heads", _I64),
                ("head_dim", _I64), ("intermediate", _I64), ("eps", ctypes.c_double),
                ("layers", ctypes.POINTER(_Layer)), ("norm", _POINTER), ("cos", _POINTER), ("sin", _POINTER)]


class _Buffers(ctypes.Structure):
    _fields_ = [("x", _POINTER), ("y", _POINTER), ("qkv", _POINTER), ("attn", _POINTER), ("gu", _POINTER),
                ("act", _POINTER)]


class _PoolAttention(ctypes.Structure):
    _fields_ = [("pools", ctypes.POINTER(_POINTER)), ("write_slots", _POINTER), ("slots", _POINTER),
                ("slot_count", _I64), ("starts", _POINTER), ("lengths", _POINTER), ("hooked_rows", _I64)]


_HOOK = ctypes.CFUNCTYPE(ctypes.c_int, _I64, _I64)
#: The hook's sites (csrc/decoder.cpp's Site): attention, then LoRA after each projection.
ATTEND = 0
#: Hook site i + 1 is the LoRA site after a layer's i-th projection.
LORA_SITES = dict(enumerate(PROJECTIONS, start=1))


@functools.cache
def _kernel() -> Any:
    return native.kernel("decoder_forward", supported="avx2_fma_f16c_supported", needs="AVX2, FMA and F16C",
                         argtypes=[ctypes.POINTER(_Model), _I64, _POINTER, ctypes.POINTER(_Buffers),
                                   ctypes.POINTER(_PoolAttention), ctypes.c_int, _HOOK, ctypes.c_int])


class PoolAttention(Protocol):
    """Attention the decoder runs itself: the new K/V go to pool slots and rows attend there on
    the native kernel; rows of length 0 in :attr:`rows` are left to :meth:`attend_rest`. An
    attention plan offers one as its ``native_pool`` attribute (the executor's, on the float16
    pool); any other plan is called back for each layer's attention."""

    #: Each layer's pool ``[slots, 2, Hkv, D]`` float16, as a C array of pointers.
    pool_pointers: ctypes.Array
    #: The pool slot of each row's new K/V.
    write_slots: torch.Tensor
    rows: PoolRows
    #: Rows the native kernel leaves to :meth:`attend_rest`.
    hooked_rows: int

    def attend_rest(self, layer: int, q: torch.Tensor, out: torch.Tensor) -> None:
        """Fill ``out``'s rows of length 0 from ``q`` [T, H, D] (their K/V are in the pool)."""
        ...


def _projection(layer: Layer, name: str) -> BlockWeights | str:
    proj = getattr(layer, name)
    if not isinstance(proj, BlockProjection) or not isinstance(proj.kernel, BlockWeights):
        return f"its {name} projection is not on ruvllm's block kernel"
    if proj.dense is not None:
        return "dense_weights keeps a dense copy for big steps"
    weights = proj.kernel
    if proj.bias is not None and (proj.bias.dtype != torch.float32 or not proj.bias.is_contiguous()):
        return f"its {name} projection's bias is not a contiguous float32 vector"
    if weights.codes.shape[0] * PANEL != weights.shape[0]:
        return f"its {name} projection has {weights.shape[0]} outputs, not a multiple of {PANEL}"
    return weights


def unavailable(model: Transformer) -> str | None:
    """Why ``model``'s layers cannot run on the native decoder, or None when they can."""
    fn = _kernel()
    if isinstance(fn, str):
        return fn
    if model.device.type != "cpu" or model.dtype != torch.float32:
        return f"the native decoder computes in float32 on CPU, not {model.dtype} on {model.device.type}"
    cfg = model.cfg
    if cfg.head_dim % 16:
        return f"the native decoder needs a head size that is a multiple of 16, not {cfg.head_dim}"
    for layer in model.layers:
        for name in PROJECTIONS:
            if isinstance(why := _projection(layer, name), str):
                return why
    return None


def _pointer(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _describe(proj: BlockProjection) -> _Projection:
    weights = proj.kernel
    assert isinstance(weights, BlockWeights)
    n, k = weights.shape
    return _Projection(weights.codes.data_ptr(), weights.scale.data_ptr(), weights.offset.data_ptr(),
                       _pointer(proj.bias), n, k, weights.bits, blockmm.scale_format(weights.scale),
                       blockmm.int8_path() if weights.int8 else 0)


class NativeDecoder:
    """A :class:`Transformer`'s layers as the native decoder reads them (pointers into the
    model's own tensors: nothing is copied, so the model must outlive it, as its attribute)."""

    def __init__(self, model: Transformer):
        cfg = model.cfg
        self.cfg = cfg
        self._layers = (_Layer * cfg.num_layers)(*[
            _Layer(layer.ln1.data_ptr(), layer.ln2.data_ptr(), *(_describe(getattr(layer, n))
                                                                 for n in PROJECTIONS))
            for layer in model.layers])
        self._model = _Model(cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                             cfg.intermediate_size, cfg.rms_norm_eps, self._layers, model.norm.data_ptr(),
                             model.rope.cos.data_ptr(), model.rope.sin.data_ptr())

    def hidden(self, x: torch.Tensor, positions: torch.Tensor, attention: Attention,
               lora: LoraPlan | None) -> torch.Tensor:
        """The final normed hidden state [T, hidden] from the embeddings ``x`` (float32, owned by
        the call: it becomes the residual stream), as :meth:`Transformer.hidden` computes it."""
        cfg = self.cfg
        n = x.shape[0]
        h, h_kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_end, k_end = h * d, (h + h_kv) * d
        x = x.contiguous()
        positions = positions.contiguous()
        y = torch.empty(n, cfg.hidden_size)
        qkv = torch.empty(n, (h + 2 * h_kv) * d)
        attn = torch.empty(n, h * d)
        gu = torch.empty(n, 2 * cfg.intermediate_size)
        act = torch.empty(n, cfg.intermediate_size)
        buffers = _Buffers(x.data_ptr(), y.data_ptr(), qkv.data_ptr(), attn.data_ptr(), gu.data_ptr(),
                           act.data_ptr())
        q = qkv[:, :q_end].view(n, h, d)
        pool: PoolAttention | None = getattr(attention, "native_pool", None)
        sites = {"qkv": (y, qkv), "o": (attn, y), "gate_up": (y, gu), "down": (act, y)}
        failure: list[BaseException] = []

        def hook(layer: int, site: int) -> int:
            try:
                if site == ATTEND:
                    if pool is not None:
                        pool.attend_rest(layer, q, attn)
                    else:
                        k = qkv[:, q_end:k_end].view(n, h_kv, d)
                        v = qkv[:, k_end:].view(n, h_kv, d)
                        attn.copy_(attention.attend(layer, q, k, v))
                else:
                    assert lora is not None
                    source, out = sites[LORA_SITES[site]]
                    result = lora.apply(layer, LORA_SITES[site], source, out)
                    if result is not out:
                        out.copy_(result)
                return 0
            except BaseException as exc:  # re-raised below: an exception cannot cross the C frames
                failure.append(exc)
                return 1

        callback = _HOOK(hook)
        plan = None
        if pool is not None:
            rows = pool.rows
            plan = _PoolAttention(pool.pool_pointers, pool.write_slots.data_ptr(), rows.slots.data_ptr(),
                                  rows.slots.shape[0], rows.starts.data_ptr(), rows.lengths.data_ptr(),
                                  pool.hooked_rows)
        rc = _kernel()(ctypes.byref(self._model), n, positions.data_ptr(), ctypes.byref(buffers),
                       None if plan is None else ctypes.byref(plan), int(lora is not None), callback,
                       torch.get_num_threads())
        if failure:
            raise failure[0]
        if rc == -3:
            raise ValueError(f"a row's attention slots run past the {pool.rows.slots.shape[0]} slots given"
                             if pool is not None else "attention rows out of range")
        if rc != 0:
            raise MemoryError(f"the native decoder could not allocate its scratch for {n} rows")
        return y
