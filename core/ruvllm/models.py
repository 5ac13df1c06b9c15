"""What a backend is asked to load: a model already located on disk."""

from __future__ import annotations

from pathlib import Path

import attrs


@attrs.frozen(kw_only=True)
class ModelSource:
    """A resolved model reference.

    ``format`` is "gguf" for a single GGUF file, "hf" for a Hugging Face directory
    (config.json, safetensors, tokenizer.json). ``name`` is what users and the OpenAI API call it.
    """

    name: str
    path: Path = attrs.field(converter=Path)
    format: str = attrs.field(validator=attrs.validators.in_(("gguf", "hf")))
    #: Where it came from: "embedded", "alias:<name>", "hf:<repo>", "path".
    origin: str = "path"

    @classmethod
    def from_path(cls, path: str | Path, name: str | None = None) -> ModelSource:
        p = Path(path).expanduser().resolve()
        fmt = "hf" if p.is_dir() else "gguf"
        default_name = p.name if p.is_dir() else p.stem
        return cls(name=name or default_name, path=p, format=fmt)
