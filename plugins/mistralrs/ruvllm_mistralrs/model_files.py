"""What ruvllm reads from the model files itself: tokenizer, chat template and model facts.

mistral.rs reads the same files for its engine; reading them here too keeps tokenization and
templating in core (one implementation for every backend) and gives ``ModelInfo`` without a
round trip through the engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
from ruvllm.errors import ModelError, ModelLoadError
from ruvllm.gguf_file import read_gguf_file
from ruvllm.hf_tokenizer import HfTokenizer
from ruvllm.models import ModelSource
from ruvllm.types import ModelInfo, SpecialTokens


@attrs.frozen(kw_only=True)
class ModelFiles:
    tokenizer: HfTokenizer
    architecture: str
    context_length: int
    vocab_size: int
    chat_template: str | None
    quantization: str | None
    parameters: int | None

    def info(self, source: ModelSource, *, context_length: int, quantization: str | None) -> ModelInfo:
        tok = self.tokenizer
        bos_text = tok.token_text(tok.bos_id) if tok.bos_id is not None else ""
        eos_text = tok.token_text(tok.eos_ids[0]) if tok.eos_ids else ""
        return ModelInfo(
            name=source.name, architecture=self.architecture, context_length=context_length,
            vocab_size=self.vocab_size,
            special_tokens=SpecialTokens(bos_id=tok.bos_id, eos_ids=tok.eos_ids,
                                         bos_text=bos_text, eos_text=eos_text),
            chat_template=self.chat_template, path=str(source.path),
            quantization=quantization or self.quantization, parameters=self.parameters,
        )


def read_model_files(source: ModelSource, tokenizer_json: str | None = None) -> ModelFiles:
    try:
        files = _read_gguf(source.path) if source.format == "gguf" else _read_hf(source.path)
    except ModelLoadError:
        raise
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(str(source.path),
                             f"cannot read the model files: {type(exc).__name__}: {exc}") from exc
    if tokenizer_json is not None:
        files = attrs.evolve(files, tokenizer=from_hf_dir_file(Path(tokenizer_json)))
    return files


def from_hf_dir_file(path: Path) -> HfTokenizer:
    if path.name != "tokenizer.json" or not path.is_file():
        raise ModelLoadError(str(path), "tokenizer_json must name an existing tokenizer.json file")
    return HfTokenizer.from_hf_dir(path.parent)


def _read_gguf(path: Path) -> ModelFiles:
    try:
        f = read_gguf_file(path)
    except ModelError as exc:
        raise ModelLoadError(str(path), str(exc)) from None
    arch = f.get("general.architecture", "unknown")
    tokenizer = HfTokenizer.from_gguf_metadata(f.metadata, source=str(path))
    return ModelFiles(
        tokenizer=tokenizer, architecture=arch,
        context_length=int(f.get(f"{arch}.context_length", 2048)),
        vocab_size=len(f.get("tokenizer.ggml.tokens") or ()),
        chat_template=tokenizer.chat_template,
        quantization=f.file_type,
        parameters=f.parameters,
    )


def _read_hf(path: Path) -> ModelFiles:
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(str(path), "no config.json: not a Hugging Face model directory")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    tokenizer = HfTokenizer.from_hf_dir(path)
    return ModelFiles(
        tokenizer=tokenizer,
        architecture=str(config.get("model_type", "unknown")),
        context_length=int(config.get("max_position_embeddings") or 2048),
        vocab_size=max(int(config.get("vocab_size") or 0), tokenizer.vocab_size),
        chat_template=tokenizer.chat_template,
        quantization=None,
        parameters=_safetensors_parameters(path),
    )


def _safetensors_parameters(path: Path) -> int | None:
    from safetensors import safe_open

    total = 0
    files = sorted(path.glob("*.safetensors"))
    for f in files:
        with safe_open(str(f), framework="np") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a dict)
                n = 1
                for d in st.get_slice(name).get_shape():
                    n *= d
                total += n
    return total or None
