"""X-LoRA checkpoints in the layout mistral.rs reads, and the check that it can run them.

An X-LoRA checkpoint as PEFT saves it is a directory with ``xlora_config.json``,
``xlora_classifier.safetensors`` and one PEFT LoRA sub-directory per adapter. mistral.rs 0.9.5
cannot read that layout from a local path: it lists a local X-LoRA directory without recursing
and matches adapter files by name, so each adapter's *directory* matches and it panics on its
missing file extension (``pipeline/paths.rs``, ``Option::unwrap()`` on ``None``). It also demands
an ordering file and that ``base_model_id`` in both JSON files equals the ``model_id`` string it
was given. So the backend stages the checkpoint: a flat directory of links to the adapters'
files under names no other file contains, and both JSON files rewritten for the model being
loaded. The checkpoint itself is never modified.

The ordering file's ``layers`` map numbers every adapted linear layer in model order (what
mistral.rs's ``scripts/create_ordering.py`` derives from PEFT); for Llama-style models it is
derived here from the adapters' ``target_modules`` when no ``order`` file is given.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from ruvllm.errors import BackendOptionError, ModelLoadError

BACKEND = "mistralrs"
CONFIG = "xlora_config.json"
CLASSIFIER = "xlora_classifier.safetensors"
ORDERING = "ordering.json"
#: Llama-style linear layers in the order the model defines them (PEFT numbers them this way).
LLAMA_MODULES = (("self_attn", "q_proj"), ("self_attn", "k_proj"), ("self_attn", "v_proj"),
                 ("self_attn", "o_proj"), ("mlp", "gate_proj"), ("mlp", "up_proj"), ("mlp", "down_proj"))


@attrs.frozen
class StagedXLora:
    """What ``Which.XLora`` is given: the staged directory and its ordering file."""

    model_id: str
    order: str
    adapters: tuple[str, ...]


def _bad(reason: str, value: Any, fix: str) -> BackendOptionError:
    return BackendOptionError(BACKEND, "xlora", reason, value, fix=fix)


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _bad(f"{what}: {path} does not exist", str(path),
                   fix="point xlora.model_id at an X-LoRA checkpoint (as PEFT saves it)") from None
    except (OSError, ValueError) as exc:
        raise _bad(f"{what}: {path} is not readable JSON ({exc})", str(path),
                   fix="repair or regenerate the file") from exc
    if not isinstance(data, dict):
        raise _bad(f"{what}: {path} must hold a JSON object", str(path), fix="repair or regenerate the file")
    return data


def _adapter_names(config: Mapping[str, Any], path: Path) -> list[str]:
    adapters = config.get("adapters")
    names = list(adapters) if isinstance(adapters, (list, dict)) else []
    if not names or not all(isinstance(n, str) and n for n in names):
        raise _bad(f"xlora.model_id: {path} must list the adapters (\"adapters\": [names] or "
                   "{name: path})", str(path), fix="regenerate the checkpoint with PEFT's X-LoRA")
    return names


def _ordering(order_file: str | None, names: Sequence[str], target_modules: set[str],
              n_layers: int) -> tuple[list[str], dict[str, int]]:
    """(adapter order, layer numbering): from the user's ordering file, or derived."""
    if order_file is not None:
        given = _read_json(Path(order_file).expanduser(), "xlora.order")
        order, layers = given.get("order"), given.get("layers")
        if not isinstance(order, list) or not isinstance(layers, dict) or not order:
            raise _bad(f"xlora.order: {order_file} needs \"order\" (adapter names) and \"layers\"",
                       order_file, fix="make it with mistral.rs's scripts/create_ordering.py, or drop "
                       "xlora.order to derive it (Llama-style models)")
        unknown = [n for n in order if n not in names]
        if unknown:
            raise _bad(f"xlora.order: adapters {unknown} are not in the checkpoint ({', '.join(names)})",
                       order_file, fix="name the checkpoint's adapters in the ordering file")
        return list(order), {str(k): int(v) for k, v in layers.items()}
    known = {m for _, m in LLAMA_MODULES}
    if not target_modules <= known:
        raise _bad(f"xlora.order: cannot derive the layer ordering for target modules "
                   f"{sorted(target_modules - known)} (only Llama-style {', '.join(sorted(known))})",
                   None, fix="give xlora.order, made with mistral.rs's scripts/create_ordering.py")
    layers: dict[str, int] = {}
    for layer in range(n_layers):
        for block, module in LLAMA_MODULES:
            if module in target_modules:
                layers[f"model.layers.{layer}.{block}.{module}"] = len(layers)
    return list(names), layers


def _check_base(base: Path, config: Mapping[str, Any]) -> dict[str, Any]:
    """The base model must fit the classifier and have the separate lm_head X-LoRA models load."""
    base_config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    hidden = config.get("hidden_size")
    if hidden != base_config.get("hidden_size"):
        raise ModelLoadError(str(base), f"the X-LoRA classifier is for hidden_size {hidden}, this model has "
                             f"{base_config.get('hidden_size')} (xlora.model_id belongs to another model)")
    if base_config.get("tie_word_embeddings") and not _has_tensor(base, "lm_head.weight"):
        raise ModelLoadError(
            str(base), "mistral.rs's X-LoRA models read a separate lm_head.weight, and this model ties it to "
            "the embeddings (tie_word_embeddings=true) without storing one; save the model with an untied "
            "lm_head.weight (a copy of model.embed_tokens.weight) to use xlora")
    return base_config


def _has_tensor(base: Path, name: str) -> bool:
    from safetensors import safe_open

    for f in sorted(base.glob("*.safetensors")):
        with safe_open(str(f), framework="np") as st:
            if name in st.keys():  # noqa: SIM118 (safe_open is not a dict)
                return True
    return False


def stage_xlora(xlora: Mapping[str, Any], base: Path, into: Path) -> StagedXLora:
    """Check the X-LoRA checkpoint ``xlora["model_id"]`` against the base model directory ``base``
    and stage it in ``into`` (a fresh directory) for ``Which.XLora``."""
    src = Path(xlora["model_id"]).expanduser()
    if not src.is_dir():
        raise _bad(f"xlora.model_id: {src} is not a directory", str(src),
                   fix="point it at an X-LoRA checkpoint directory (xlora_config.json, "
                   "xlora_classifier.safetensors, one PEFT sub-directory per adapter)")
    config = _read_json(src / CONFIG, "xlora.model_id")
    if not (src / CLASSIFIER).is_file():
        raise _bad(f"xlora.model_id: {src} has no {CLASSIFIER}", str(src),
                   fix="save the trained classifier with the checkpoint")
    names = _adapter_names(config, src / CONFIG)
    target_modules: set[str] = set()
    for name in names:
        adapter = src / name
        if not (adapter / "adapter_model.safetensors").is_file():
            raise _bad(f"xlora.model_id: adapter {name!r} has no {adapter}/adapter_model.safetensors",
                       str(src), fix="keep each adapter in a PEFT sub-directory named as in xlora_config")
        adapter_config = _read_json(adapter / "adapter_config.json", f"xlora adapter {name!r}")
        target_modules |= set(adapter_config.get("target_modules") or ())
    base_config = _check_base(base, config)
    order, layers = _ordering(xlora.get("order"), names, target_modules,
                              int(base_config.get("num_hidden_layers") or 0))

    # mistral.rs finds an adapter's files by substring match on the names in the ordering:
    # fixed-width aliases contain no other alias and no other file's name.
    into.mkdir(parents=True)
    aliases = [f"adapter-{i:03d}" for i in range(len(order))]
    for alias, name in zip(aliases, order, strict=True):
        (into / f"{alias}.safetensors").symlink_to((src / name / "adapter_model.safetensors").resolve())
        (into / f"{alias}.json").symlink_to((src / name / "adapter_config.json").resolve())
    (into / CLASSIFIER).symlink_to((src / CLASSIFIER).resolve())
    staged_config = {**config, "base_model_id": str(base), "adapters": aliases}
    (into / CONFIG).write_text(json.dumps(staged_config), encoding="utf-8")
    ordering = {"order": aliases, "layers": layers, "base_model_id": str(base)}
    (into / ORDERING).write_text(json.dumps(ordering), encoding="utf-8")
    return StagedXLora(model_id=str(into), order=str(into / ORDERING), adapters=tuple(order))


#: A prompt of several tokens: mistral.rs 0.9.5's X-LoRA models run one-token prompts but fail the
#: prompt step of any longer one (see :func:`probe`).
PROBE_TEXT = "The capital of France is"


def probe(runner: Any, m: Any) -> str | None:
    """Run one short greedy request on a freshly loaded X-LoRA model; return mistral.rs's error
    text if it cannot generate, else None.

    Measured with mistralrs 0.9.5 (CPU): the X-LoRA model loads and a one-token prompt generates
    (its output differs from the base model's, so adapters and classifier are applied), but any
    longer prompt fails in the prompt step with ``RoPE positions length 1 does not match token
    count N``: the rotary-embedding op receives one position per sequence where it counts one per
    token. Decode steps (one token per sequence) match, so only the prompt step fails; no option
    changes it. Probing at load keeps a model that cannot serve real prompts from starting, and
    lets a mistral.rs release that fixes it work without a change here.
    """
    request = m.ChatCompletionRequest(messages=[{"role": "user", "content": PROBE_TEXT}], model="default",
                                      max_tokens=1, temperature=0.0)
    try:
        runner.send_chat_completion_request(request)
    except Exception as exc:  # mistral.rs raises ValueError with its engine's message
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


#: Why X-LoRA is absent with the mistral.rs versions measured here (capabilities().notes). 0.9.5 is
#: the newest release on PyPI (2026-11-23); the pin in constraints.txt waits for the first later
#: release whose X-LoRA passes :func:`probe`, and this entry goes when the pin moves to it.
KNOWN_BROKEN = {"0.9.5": "RoPE positions length 1 does not match token count N"}


def xlora_unavailable_reason(build: Any, failure: str) -> str:
    return (f"xlora: mistral.rs {build.version} ({build.distribution}) loads this X-LoRA model but cannot "
            f"generate from a prompt of more than one token: {failure!r} (its X-LoRA prompt step hands the "
            f"rotary embedding one position per sequence). Use dynamic LoRA (adapters = {{...}}, per-request "
            f"adapter) or a mistral.rs release that fixes X-LoRA")
