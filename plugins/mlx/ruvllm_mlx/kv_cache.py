"""Per-sequence KV caches, in full precision or quantized with ``mx.quantize``.

Each sequence owns one cache; its per-layer arrays grow in steps of :data:`STEP` positions and
are written in place, as mlx-lm's caches are. The quantized variant stores K and V affine-
quantized along the head dimension (``kv_bits``, ``kv_group_size``) and dequantizes on read: it
cuts KV memory (8-bit: ~3.6x less than float32) at the cost of a dequantize per step.
"""

from __future__ import annotations

from ruvllm.errors import BackendError

from ruvllm_mlx.mlx_core import mx

STEP = 256


def _grow(array: mx.array, used: int, capacity: int) -> mx.array:
    shape = list(array.shape)
    shape[2] = capacity
    grown = mx.zeros(shape, dtype=array.dtype)
    if used:
        grown[:, :, :used, :] = array[:, :, :used, :]
    return grown


class SequenceCache:
    """K/V of one sequence for every layer: ``[1, kv_heads, positions, head_dim]``."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, dtype: mx.Dtype,
                 quantize: tuple[int, int] | None = None):
        self.num_layers = num_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        #: (bits, group_size) when K/V are stored quantized.
        self.quantize = quantize
        #: Positions whose K/V are valid.
        self.length = 0
        self.capacity = 0
        # Per layer: a tuple of stored arrays for K and for V (one array, or packed/scales/biases).
        self._keys: list[tuple[mx.array, ...]] = []
        self._values: list[tuple[mx.array, ...]] = []

    def _empty(self, capacity: int) -> tuple[mx.array, ...]:
        shape = (1, self.kv_heads, capacity)
        if self.quantize is None:
            return (mx.zeros((*shape, self.head_dim), dtype=self.dtype),)
        bits, group = self.quantize
        return (
            mx.zeros((*shape, self.head_dim * bits // 32), dtype=mx.uint32),
            mx.zeros((*shape, self.head_dim // group), dtype=self.dtype),
            mx.zeros((*shape, self.head_dim // group), dtype=self.dtype),
        )

    def _reserve(self, end: int) -> None:
        if end <= self.capacity:
            return
        capacity = (end + STEP - 1) // STEP * STEP
        if not self._keys:
            self._keys = [self._empty(capacity) for _ in range(self.num_layers)]
            self._values = [self._empty(capacity) for _ in range(self.num_layers)]
        else:
            for store in (self._keys, self._values):
                for i, parts in enumerate(store):
                    store[i] = tuple(_grow(p, self.length, capacity) for p in parts)
        self.capacity = capacity

    def _encode(self, x: mx.array) -> tuple[mx.array, ...]:
        if self.quantize is None:
            return (x.astype(self.dtype),)
        bits, group = self.quantize
        return tuple(mx.quantize(x, group_size=group, bits=bits))

    def _decode(self, parts: tuple[mx.array, ...], end: int) -> mx.array:
        if self.quantize is None:
            return parts[0][:, :, :end, :]
        bits, group = self.quantize
        w, s, b = (p[:, :, :end, :] for p in parts)
        return mx.dequantize(w, s, b, group_size=group, bits=bits).astype(self.dtype)

    def begin(self, start: int, count: int) -> None:
        """Prepare to write positions ``[start, start + count)``; later positions are dropped."""
        if start > self.length:
            raise BackendError(
                f"KV cache holds {self.length} positions but a step starts at position {start}; "
                f"the engine skipped positions of this sequence"
            )
        self.length = start
        self._reserve(start + count)

    def update(self, layer: int, keys: mx.array, values: mx.array, start: int) -> tuple[mx.array, mx.array]:
        """Write one layer's new K/V at ``start`` and return K/V of positions ``[0, end)``."""
        end = start + keys.shape[2]
        for store, new in ((self._keys, keys), (self._values, values)):
            parts = list(store[layer])
            for i, enc in enumerate(self._encode(new)):
                parts[i][:, :, start:end, :] = enc
            store[layer] = tuple(parts)
        return self._decode(self._keys[layer], end), self._decode(self._values[layer], end)

    def commit(self, end: int) -> None:
        """All layers now hold positions ``[0, end)``."""
        self.length = end

    def copy_prefix_from(self, other: SequenceCache, num_tokens: int) -> None:
        """Take the first ``num_tokens`` positions of ``other`` (sharing a cached prefix)."""
        if num_tokens > other.length:
            raise BackendError(f"cannot copy {num_tokens} positions from a cache holding {other.length}")
        self.length = 0
        self._keys, self._values, self.capacity = [], [], 0
        if num_tokens == 0:
            return
        self._reserve(num_tokens)
        for dst, src in ((self._keys, other._keys), (self._values, other._values)):
            for layer in range(self.num_layers):
                parts = list(dst[layer])
                for i, p in enumerate(src[layer]):
                    parts[i][:, :, :num_tokens, :] = p[:, :, :num_tokens, :]
                dst[layer] = tuple(parts)
        self.length = num_tokens

    def arrays(self) -> list[mx.array]:
        return [p for store in (self._keys, self._values) for parts in store for p in parts]
