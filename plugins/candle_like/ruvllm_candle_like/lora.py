"""LoRA for the candle_like Transformer: PEFT-format adapters, a registry of named adapters, and
the per-row plan the forward pass applies.

An adapter adds ``scale * B @ A`` to chosen projections (``W' = W + (alpha / r) * B A``). The
weights stay untouched: the forward pass adds ``scale * (x A^T) B^T`` to the projection's
output, on the rows (tokens) whose request asked for that adapter. The model fuses q/k/v and
gate/up into one matrix each, so a q_proj delta lands on the q slice of the fused qkv output.
Rows without an adapter get no extra operation at all, so the base model's output is exactly
what it was before any adapter was loaded.

Adapters are immutable once built. Publishing a new version replaces the registry entry (one
dict assignment): a step that already took its adapters keeps reading the old tensors, the next
step reads the new ones, so no forward pass ever sees half-updated weights.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs
import torch
import torch.nn.functional as F
from ruvllm.errors import InvalidRequest, ModelLoadError

from ruvllm_candle_like.config import ModelConfig

#: PEFT module name -> (fused site in the model, index of the slice within that site).
TARGETS: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv", 0), "k_proj": ("qkv", 1), "v_proj": ("qkv", 2), "o_proj": ("o", 0),
    "gate_proj": ("gate_up", 0), "up_proj": ("gate_up", 1), "down_proj": ("down", 0),
}
_SUBMODULE = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
              "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
PEFT_PREFIX = "base_model.model.model.layers"
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


def projection_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each LoRA-able projection."""
    hq, hkv, h = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.hidden_size
    inter = cfg.intermediate_size
    return {"q_proj": (hq, h), "k_proj": (hkv, h), "v_proj": (hkv, h), "o_proj": (h, hq),
            "gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter)}


def site_slices(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """Column range of each projection's output inside its fused site's output."""
    hq, hkv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    inter = cfg.intermediate_size
    return {"q_proj": (0, hq), "k_proj": (hq, hq + hkv), "v_proj": (hq + hkv, hq + 2 * hkv),
            "o_proj": (0, cfg.hidden_size), "gate_proj": (0, inter), "up_proj": (inter, 2 * inter),
            "down_proj": (0, cfg.hidden_size)}


@attrs.frozen(kw_only=True)
class LoraPair:
    """One projection's low-rank update: ``delta(x) = scale * (x @ a.T) @ b.T``."""

    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]
    #: Column range of the fused site's output this projection writes.
    cols: tuple[int, int]


@attrs.frozen(kw_only=True, eq=False)
class LoraAdapter:
    """An immutable set of LoRA pairs for one model; build a new one to change it."""

    name: str
    rank: int
    alpha: float
    targets: tuple[str, ...]
    #: (layer, PEFT module name) -> pair.
    pairs: Mapping[tuple[int, str], LoraPair]
    use_rslora: bool = False

    @property
    def scale(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)

    def by_site(self) -> dict[tuple[int, str], list[LoraPair]]:
        out: dict[tuple[int, str], list[LoraPair]] = {}
        for (layer, module), pair in self.pairs.items():
            out.setdefault((layer, TARGETS[module][0]), []).append(pair)
        return out

    # -- PEFT -------------------------------------------------------------------------------

    def save_peft(self, directory: str | Path, *, base_model: str | None = None) -> Path:
        """Write ``adapter_config.json`` + ``adapter_model.safetensors`` (the PEFT layout that
        ``peft.PeftModel.from_pretrained`` and mistral.rs read)."""
        from safetensors.torch import save_file

        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for (layer, module), pair in self.pairs.items():
            key = f"{PEFT_PREFIX}.{layer}.{_SUBMODULE[module]}.{module}"
            tensors[f"{key}.lora_A.weight"] = pair.a.detach().float().contiguous().cpu()
            tensors[f"{key}.lora_B.weight"] = pair.b.detach().float().contiguous().cpu()
        config = {
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": self.rank, "lora_alpha": self.alpha,
            "target_modules": sorted(self.targets), "lora_dropout": 0.0, "bias": "none",
            "fan_in_fan_out": False, "use_rslora": self.use_rslora, "inference_mode": True,
            "base_model_name_or_path": base_model,
        }
        (path / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": "pt"})
        return path


def build_adapter(name: str, cfg: ModelConfig, rank: int, alpha: float,
                  weights: Mapping[tuple[int, str], tuple[torch.Tensor, torch.Tensor]], *,
                  dtype: torch.dtype, device: torch.device, use_rslora: bool = False) -> LoraAdapter:
    """Check shapes against the model and build an adapter in the model's dtype."""
    if not isinstance(name, str) or not name:
        raise InvalidRequest("name", "an adapter needs a non-empty name", name)
    shapes = projection_shapes(cfg)
    cols = site_slices(cfg)
    pairs = {}
    for (layer, module), (a, b) in weights.items():
        if module not in TARGETS:
            raise InvalidRequest("target_modules", f"{module!r} is not a projection of this model; use "
                                 f"{', '.join(TARGETS)}", module)
        if not 0 <= layer < cfg.num_layers:
            raise InvalidRequest("layers", f"layer {layer} is outside the model's 0..{cfg.num_layers - 1}")
        out_f, in_f = shapes[module]
        if tuple(a.shape) != (a.shape[0], in_f) or tuple(b.shape) != (out_f, a.shape[0]) or a.shape[0] < 1:
            raise InvalidRequest("weights", f"layer {layer} {module}: lora_A {tuple(a.shape)} / lora_B "
                                 f"{tuple(b.shape)} do not fit a ({out_f}, {in_f}) projection")
        pairs[(layer, module)] = LoraPair(a=a.detach().to(device=device, dtype=dtype).contiguous(),
                                          b=b.detach().to(device=device, dtype=dtype).contiguous(),
                                          cols=cols[module])
    if not pairs:
        raise InvalidRequest("weights", "an adapter needs at least one projection")
    return LoraAdapter(name=name, rank=rank, alpha=float(alpha), pairs=pairs, use_rslora=use_rslora,
                       targets=tuple(sorted({m for _, m in pairs})))


def load_peft(directory: str | Path, name: str, cfg: ModelConfig, *, dtype: torch.dtype,
              device: torch.device) -> LoraAdapter:
    """Read a PEFT LoRA directory saved for this model's architecture."""
    from safetensors.torch import load_file

    path = Path(directory)
    cfg_file, weights_file = path / CONFIG_FILE, path / WEIGHTS_FILE
    if not cfg_file.is_file() or not weights_file.is_file():
        raise ModelLoadError(str(path), f"a PEFT LoRA directory holds {CONFIG_FILE} and {WEIGHTS_FILE}")
    try:
        conf = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(str(cfg_file), f"not valid JSON: {exc}") from None
    if str(conf.get("peft_type", "LORA")).upper() != "LORA":
        raise ModelLoadError(str(cfg_file), f"peft_type {conf.get('peft_type')!r} is not LORA")
    for unsupported in ("use_dora", "rank_pattern", "alpha_pattern"):
        if conf.get(unsupported):
            raise ModelLoadError(str(cfg_file), f"{unsupported} is not supported by candle_like's LoRA")
    rank = int(conf["r"])
    alpha = float(conf.get("lora_alpha", rank))
    tensors = load_file(str(weights_file))
    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        parts = key.split(".")
        # ... layers.{N}.{self_attn|mlp}.{module}.lora_{A|B}[.adapter].weight
        try:
            i = parts.index("layers")
            layer, module, which = int(parts[i + 1]), parts[i + 3], parts[i + 4]
        except (ValueError, IndexError):
            raise ModelLoadError(str(weights_file), f"unexpected tensor name {key!r}") from None
        if which not in ("lora_A", "lora_B"):
            raise ModelLoadError(str(weights_file), f"unexpected tensor {key!r} (only lora_A/lora_B)")
        found.setdefault((layer, module), {})[which] = t
    weights = {}
    for k, ab in found.items():
        if set(ab) != {"lora_A", "lora_B"}:
            raise ModelLoadError(str(weights_file), f"layer {k[0]} {k[1]} lacks lora_A or lora_B")
        weights[k] = (ab["lora_A"], ab["lora_B"])
    try:
        return build_adapter(name, cfg, rank, alpha, weights, dtype=dtype, device=device,
                             use_rslora=bool(conf.get("use_rslora", False)))
    except InvalidRequest as exc:
        raise ModelLoadError(str(path), str(exc)) from None


class AdapterRegistry:
    """Named adapters of one loaded model, shared by the request path and the executor.

    ``publish`` and ``unload`` replace dict entries (atomic under the GIL); readers take the
    adapter object once per step or request and keep it. ``revision`` grows with every change
    of a name, so the engine's prefix cache never reuses KV computed with an older version.
    An unloaded adapter stays resolvable for requests already running with it (``retired``),
    but new requests naming it are refused.
    """

    def __init__(self) -> None:
        self._live: dict[str, LoraAdapter] = {}
        self._retired: dict[str, LoraAdapter] = {}
        self._revision: dict[str, int] = {}
        self._lock = threading.Lock()

    def publish(self, adapter: LoraAdapter) -> int:
        with self._lock:
            self._live[adapter.name] = adapter
            self._retired.pop(adapter.name, None)
            rev = self._revision.get(adapter.name, 0) + 1
            self._revision[adapter.name] = rev
            return rev

    def unload(self, name: str) -> None:
        with self._lock:
            adapter = self._live.pop(name, None)
            if adapter is None:
                raise InvalidRequest("adapter", f"no adapter named {name!r} is loaded; loaded: "
                                     f"{', '.join(sorted(self._live)) or 'none'}", name)
            self._retired[name] = adapter
            self._revision[name] = self._revision.get(name, 0) + 1

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._live))

    def revision(self, name: str) -> int:
        """The name's revision; InvalidRequest (field ``adapter``) when it is not loaded."""
        if name not in self._live:
            raise InvalidRequest("adapter", f"no adapter named {name!r} is loaded; loaded: "
                                 f"{', '.join(self.names()) or 'none'} (load one with load_adapter)", name)
        return self._revision[name]

    def get(self, name: str) -> LoraAdapter | None:
        return self._live.get(name)

    def resolve(self, name: str) -> LoraAdapter:
        """The adapter a running request uses (a retired one still resolves)."""
        adapter = self._live.get(name) or self._retired.get(name)
        if adapter is None:
            raise InvalidRequest("adapter", f"no adapter named {name!r} is loaded", name)
        return adapter


class LoraPlan:
    """Which rows of a step's flat token list run with which adapter.

    ``groups`` pairs an adapter with the row indices using it (None: every row). Built once
    per step; the model calls :meth:`apply` after each LoRA-able projection.
    """

    def __init__(self, groups: Sequence[tuple[LoraAdapter, torch.Tensor | None]]):
        self.groups = [(adapter, rows, adapter.by_site(), adapter.scale) for adapter, rows in groups]

    @classmethod
    def for_rows(cls, row_adapters: Iterable[tuple[int, int, LoraAdapter | None]],
                 device: torch.device) -> LoraPlan | None:
        """From (first row, row count, adapter) spans; None when no row has an adapter."""
        by_adapter: dict[int, tuple[LoraAdapter, list[int]]] = {}
        total = 0
        for first, count, adapter in row_adapters:
            total += count
            if adapter is not None:
                by_adapter.setdefault(id(adapter), (adapter, []))[1].extend(range(first, first + count))
        if not by_adapter:
            return None
        groups = []
        for adapter, rows in by_adapter.values():
            idx = None if len(rows) == total else torch.tensor(rows, dtype=torch.long, device=device)
            groups.append((adapter, idx))
        return cls(groups)

    def apply(self, layer: int, site: str, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` (the site's projection of ``x``) plus every group's delta on its rows."""
        for _, rows, sites, scale in self.groups:
            pairs = sites.get((layer, site))
            if not pairs:
                continue
            xs = x if rows is None else x.index_select(0, rows)
            for pair in pairs:
                delta = F.linear(F.linear(xs, pair.a), pair.b) * scale
                lo, hi = pair.cols
                if rows is None:
                    out = _add_cols(out, lo, hi, delta)
                else:
                    out = _add_rows_cols(out, rows, lo, hi, delta)
        return out


def _add_cols(out: torch.Tensor, lo: int, hi: int, delta: torch.Tensor) -> torch.Tensor:
    if lo == 0 and hi == out.shape[1]:
        return out + delta
    # Out of place, so autograd can train through it as well as inference can run it.
    return torch.cat([out[:, :lo], out[:, lo:hi] + delta, out[:, hi:]], dim=1)


def _add_rows_cols(out: torch.Tensor, rows: torch.Tensor, lo: int, hi: int,
                   delta: torch.Tensor) -> torch.Tensor:
    full = out.new_zeros((rows.shape[0], out.shape[1]))
    full[:, lo:hi] = delta
    return out.index_add(0, rows, full)
