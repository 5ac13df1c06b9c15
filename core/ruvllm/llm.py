"""``LLM``: the Python entry point — pick a backend, load a model, generate.

>>> from ruvllm import LLM
>>> with LLM() as llm:                      # auto backend, embedded model
...     print(llm.generate("The capital of France is", max_tokens=8).text)

Whatever engine runs underneath, prompts are validated, tokens sampled, stopped and
detokenized by the same core code, so results are comparable across backends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ruvllm.adapters import adapter_cache_key
from ruvllm.backend import LlmBackend
from ruvllm.chat import DEFAULT_OPTIONS, TemplateOptions, render_chat
from ruvllm.config import Config, load_config, merged_options
from ruvllm.generation import GenerationStream, RequestOutputBuilder, check_prompt
from ruvllm.models import ModelSource
from ruvllm.plugins import BackendRegistry, get_registry
from ruvllm.registry import resolve
from ruvllm.tokenizer import Tokenizer, require_prompt_text
from ruvllm.types import Capabilities, GenerationParams, GenerationResult, ModelInfo, TokenOutput

Prompt = str | Sequence[int]


def make_params(params: GenerationParams | None, overrides: Mapping[str, Any]) -> GenerationParams:
    if params is not None and overrides:
        return GenerationParams(**{**_asdict(params), **overrides})
    return params if params is not None else GenerationParams(**overrides)


def _asdict(params: GenerationParams) -> dict[str, Any]:
    import attrs

    return attrs.asdict(params, recurse=False)


class LLM:
    """One model loaded on one backend, with request-level generation.

    Calls are serialised: a request-level backend runs one request at a time. For many
    concurrent requests use the ServingEngine, which batches them into one forward pass.
    """

    def __init__(
        self,
        model: str | ModelSource | None = None,
        backend: str | None = None,
        *,
        config: Config | None = None,
        options: Mapping[str, Any] | None = None,
        registry: BackendRegistry | None = None,
    ):
        config = config or load_config()
        self.config = config
        registry = registry or get_registry()
        if isinstance(model, ModelSource):
            self.model = model
        else:
            self.model = resolve(model or config.model, config.cache_dir)
        # generate() serves one request at a time: `auto` picks for one client.
        cls = registry.select(backend or config.backend, self.model, load=1, cache_dir=config.cache_dir)
        opts = {**merged_options(config, cls.name), **(options or {})}
        self.backend: LlmBackend = cls.load(self.model, opts)
        self._lock = threading.Lock()

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @property
    def tokenizer(self) -> Tokenizer:
        return self.backend.tokenizer

    @property
    def info(self) -> ModelInfo:
        return self.backend.info

    @property
    def capabilities(self) -> Capabilities:
        return self.backend.capabilities()

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a text prompt (with BOS where the model wants it), or ids as given."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(require_prompt_text(prompt), add_special=True)
        return list(prompt)

    def chat_prompt(self, messages: Sequence[Mapping[str, Any]],
                    options: TemplateOptions = DEFAULT_OPTIONS) -> list[int]:
        """Token ids of ``messages`` rendered with the model's own chat template, as the server's
        ``chat_template_kwargs`` / ``continue_final_message`` / ``add_generation_prompt`` ask
        (``options``: a final assistant message is continued unless they say otherwise)."""
        st = self.info.special_tokens
        text = render_chat(self.info.chat_template, messages,
                           bos_token=st.bos_text, eos_token=st.eos_text, options=options)
        return self.tokenizer.encode(text, add_special=False, parse_special=True)

    def stream(self, prompt: Prompt, params: GenerationParams | None = None,
               **overrides: Any) -> GenerationStream:
        """Stream :class:`TokenOutput` items; ``stream.result`` holds the result afterwards."""
        p = make_params(params, overrides)
        ids = self.encode(prompt)
        check_prompt(ids, p, self.info.context_length, self.tokenizer.vocab_size)
        adapter_cache_key(self.backend, p.adapter)  # an unknown adapter is refused before running
        builder = RequestOutputBuilder(self.tokenizer, ids, p)
        return GenerationStream(self._locked(ids, p), builder, queued_at=time.perf_counter())

    def _locked(self, ids: list[int], params: GenerationParams) -> Iterator[Any]:
        with self._lock:
            yield from self.backend.generate(ids, params)

    def generate(self, prompt: Prompt, params: GenerationParams | None = None,
                 **overrides: Any) -> GenerationResult:
        return self.stream(prompt, params, **overrides).collect()

    def chat(self, messages: Sequence[Mapping[str, Any]], params: GenerationParams | None = None,
             **overrides: Any) -> GenerationResult:
        return self.generate(self.chat_prompt(messages), params, **overrides)

    def chat_stream(self, messages: Sequence[Mapping[str, Any]],
                    params: GenerationParams | None = None, **overrides: Any) -> Iterator[TokenOutput]:
        return self.stream(self.chat_prompt(messages), params, **overrides)

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
