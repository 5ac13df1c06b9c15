"""The model's own tokenizer in the ingress process.

The OpenAI app calls the tokenizer synchronously (decode for echo and /detokenize, the
vocabulary's bytes for grammars, counts), so it cannot be a remote call, and it must be the very
tokenizer the replicas use: a look-alike (say, a Hugging Face tokenizer rebuilt from GGUF
metadata) can split text differently and break greedy parity. The ingress therefore loads the
configured backend once, on CPU, for its tokenizer and never runs the model there. The cost is
one more copy of the weights in the ingress's host memory (about 90 MB for the embedded
SmolLM2-135M Q4_1), not a GPU.
"""

from __future__ import annotations

from typing import Any

from ruvllm.config import Config, merged_options


def load_tokenizer_backend(config: Config, backend: str) -> Any:
    """``backend`` (the one the replicas run) with the configured model loaded (its
    ``tokenizer`` is the model's)."""
    from ruvllm.plugins import get_registry
    from ruvllm.registry import resolve

    registry = get_registry()
    source = resolve(config.model, config.cache_dir)
    backend_cls = registry.select(backend, source)
    return backend_cls.load(source, merged_options(config, backend_cls.name))
