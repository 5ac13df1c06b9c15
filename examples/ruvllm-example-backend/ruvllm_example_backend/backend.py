"""``ExampleBackend``: a complete request-level ruvllm backend over llama-cpp-python's ``Llama``.

The engine only computes logits. Everything else comes from ruvllm core, so this backend
behaves like every other one: the tokenizer is core's ``HfTokenizer`` rebuilt from the GGUF
metadata, sampling is core's sampler (``sample_stream``), and core decides when a request ends.
It has no iteration-level executor (``create_executor`` is optional): the ServingEngine serves
it one request at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import attrs
import llama_cpp
import numpy as np
from ruvllm.backend import LlmBackend, sample_stream
from ruvllm.errors import ContextLengthExceeded, InvalidRequest, ModelError, ModelLoadError
from ruvllm.gguf_file import read_gguf_file
from ruvllm.hf_tokenizer import HfTokenizer
from ruvllm.models import ModelSource
from ruvllm.options import int_range, optional, parse_options, positive_int
from ruvllm.types import Capabilities, GenerationParams, ModelInfo, SampledToken, SpecialTokens


@attrs.frozen(kw_only=True)
class ExampleOptions:
    """The ``[backends.example]`` table (or ``--option KEY=VALUE``), validated before loading."""

    BACKEND: ClassVar[str] = "example"

    #: Context window in tokens (prompt plus output of one request).
    n_ctx: int = attrs.field(default=2048, validator=int_range(16))
    #: CPU threads llama.cpp uses (unset: llama-cpp-python's default, half the CPUs).
    n_threads: int | None = attrs.field(default=None, validator=optional(positive_int()))


def read_tokenizer(model: ModelSource) -> tuple[HfTokenizer, str]:
    """Core's tokenizer and the architecture name, from the GGUF file's metadata."""
    try:
        header = read_gguf_file(model.path)
    except ModelError as exc:
        raise ModelLoadError(model.name, str(exc)) from None
    tokenizer = HfTokenizer.from_gguf_metadata(header.metadata, source=model.name)
    return tokenizer, str(header.get("general.architecture", "unknown"))


class ExampleBackend(LlmBackend):
    """One GGUF model in one ``llama_cpp.Llama``, serving one request at a time."""

    name: ClassVar[str] = "example"
    formats: ClassVar[tuple[str, ...]] = ("gguf",)

    @classmethod
    def capabilities(cls) -> Capabilities:
        return Capabilities(
            executor=False,
            logprobs=True,  # core's sampler computes them from the logits we return
            core_sampler=True,
            notes=("no iteration-level executor: the ServingEngine serves one request at a time",),
        )

    @classmethod
    def version(cls) -> str | None:
        return f"llama-cpp-python {llama_cpp.__version__}"

    @classmethod
    def load(cls, model: ModelSource, options: Mapping[str, Any]) -> ExampleBackend:
        opts = parse_options(ExampleOptions, cls.name, options)  # bad options fail before any I/O
        if model.format != "gguf":
            raise ModelLoadError(model.name, f"the example backend reads GGUF files, not {model.format}")
        tokenizer, architecture = read_tokenizer(model)
        try:
            llm = llama_cpp.Llama(str(model.path), n_ctx=opts.n_ctx, n_batch=min(512, opts.n_ctx),
                                  n_threads=opts.n_threads, n_threads_batch=opts.n_threads,
                                  logits_all=False, verbose=False)
        except ValueError as exc:  # llama-cpp-python's "Failed to load model from file"
            raise ModelLoadError(model.name, str(exc)) from None
        if llm.n_vocab() < tokenizer.vocab_size:
            llm.close()
            raise ModelLoadError(model.name, f"the model has {llm.n_vocab()} logits per position but the "
                                             f"tokenizer {tokenizer.vocab_size} tokens")
        return cls(llm, model, tokenizer, architecture)

    def __init__(self, llm: llama_cpp.Llama, source: ModelSource, tokenizer: HfTokenizer,
                 architecture: str):
        """Use :meth:`load`; this wires up an already loaded model."""
        self._llm = llm
        self._tokenizer = tokenizer
        bos, eos = tokenizer.bos_id, tokenizer.eos_ids
        self._info = ModelInfo(
            name=source.name,
            architecture=architecture,
            context_length=llm.n_ctx(),
            vocab_size=tokenizer.vocab_size,  # must equal the tokenizer's (the suite checks)
            special_tokens=SpecialTokens(
                bos_id=bos,
                eos_ids=eos,
                # Chat templates write {{ bos_token }} / {{ eos_token }}; an empty eos_text
                # makes the suite skip its "user text is not parsed as special" test.
                bos_text=tokenizer.token_text(bos) if bos is not None else "",
                eos_text=tokenizer.token_text(eos[0]) if eos else "",
            ),
            chat_template=tokenizer.chat_template,
            path=str(source.path),
        )

    @property
    def tokenizer(self) -> HfTokenizer:
        return self._tokenizer

    @property
    def info(self) -> ModelInfo:
        return self._info

    def generate(self, prompt_ids: Sequence[int], params: GenerationParams) -> Iterator[SampledToken]:
        # Core checks prompts before calling us; this guard is for direct callers, and it runs
        # now rather than on the first next() because the generator below is lazy.
        prompt = list(prompt_ids)
        if not prompt:
            raise InvalidRequest("prompt", "must contain at least one token; got an empty prompt")
        n_ctx = self._info.context_length
        if len(prompt) >= n_ctx:
            raise ContextLengthExceeded(len(prompt), 1, n_ctx)
        return self._run(prompt, params, room=n_ctx - len(prompt))

    def _run(self, prompt: list[int], params: GenerationParams, room: int) -> Iterator[SampledToken]:
        llm, vocab_size = self._llm, self._tokenizer.vocab_size
        # Llama.eval() first removes every KV cell from position n_tokens on, so after reset()
        # nothing of an earlier request can be seen.
        llm.reset()

        def evaluate(tokens: Sequence[int]) -> np.ndarray:
            llm.eval(tokens)
            # The last position's logits. Llama.scores holds them only with logits_all=True,
            # which computes and stores (n_ctx x n_vocab floats) a row for every prompt token.
            row = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
            # Cut rows wider than the tokenizer (padded vocabularies): core samples over
            # exactly info.vocab_size ids.
            return np.ctypeslib.as_array(row, shape=(llm.n_vocab(),))[:vocab_size].copy()

        try:
            yield from sample_stream(evaluate, prompt, params, vocab_size, room,
                                     tokenizer=self.tokenizer)
        finally:  # also when core closes the stream early (EOS, stop string, client gone)
            llm.reset()

    def cached_tokens(self) -> int:
        """Tokens the Llama would reuse on its next eval(): 0 between requests."""
        return self._llm.n_tokens

    def close(self) -> None:
        self._llm.close()
