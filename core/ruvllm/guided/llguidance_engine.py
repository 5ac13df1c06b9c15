"""llguidance behind the grammar-engine contract (the default ``guided_decoding_backend``).

llguidance compiles a grammar lazily against the vocabulary (~2-3 ms for a typical schema at 49k
tokens), so a compiled ``LLMatcher`` is kept as the template and each request gets a
``deep_copy`` (~50 us). Its ``LLExecutor`` fills the masks of many matchers in one call with the
GIL released.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import llguidance
import llguidance.numpy as lln
import numpy as np
from llguidance.gbnf_to_lark import GbnfToLarkError, gbnf_to_lark

from ruvllm.errors import InvalidRequest
from ruvllm.guided.engine import GrammarEngine, GuidedMatcher, first_lines
from ruvllm.guided.grammar import GrammarSpec
from ruvllm.guided.tokenizer import cached_view, require_eos, token_byte_table
from ruvllm.tokenizer import Tokenizer


def parser_limits() -> Any:
    """llguidance's resource limits; its defaults, with short errors (no grammar dumps)."""
    return llguidance.LLParserLimits(verbose_errors=False)


class _VocabSource:
    """The object ``llguidance.TokenizerWrapper`` reads: token bytes, EOS/BOS and an encoder."""

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer
        self.tokens = token_byte_table(tokenizer)
        self.eos_token_id = tokenizer.eos_ids[0]
        self.bos_token_id = getattr(tokenizer, "bos_token_id", None) or tokenizer.bos_id
        self.special_token_ids = [i for i in range(len(self.tokens)) if tokenizer.is_special(i)]

    def __call__(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special=False, parse_special=False)


def _build_tokenizer(tokenizer: Tokenizer) -> Any:
    require_eos(tokenizer)
    source = _VocabSource(tokenizer)
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(source), n_vocab=len(source.tokens),
                                  eos_token=list(tokenizer.eos_ids))


def ll_tokenizer(tokenizer: Tokenizer) -> Any:
    """The ``llguidance.LLTokenizer`` for ``tokenizer``, built once and cached per object."""
    return cached_view(tokenizer, "llguidance", _build_tokenizer)


def ll_grammar(spec: GrammarSpec) -> str:
    """llguidance's serialised grammar for ``spec`` (JSON is generated compactly)."""
    try:
        if spec.language == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(
                spec.source, defaults={"whitespace_flexible": False})
        if spec.language == "regex":
            return llguidance.LLMatcher.grammar_from_regex(spec.source)
        if spec.language == "gbnf":
            return llguidance.LLMatcher.grammar_from_lark(gbnf_to_lark(spec.source))
        return llguidance.LLMatcher.grammar_from_lark(spec.source)
    except (ValueError, TypeError, GbnfToLarkError) as exc:
        what = "JSON schema" if spec.language == "json_schema" else f"{spec.kind} grammar"
        raise InvalidRequest(spec.field, f"is not a usable {what}: {exc}") from exc


class _Matcher:
    """An ``LLMatcher`` seen through :class:`~ruvllm.guided.engine.GuidedMatcher`."""

    __slots__ = ("ll",)

    def __init__(self, ll: Any):
        self.ll = ll

    def consume_token(self, token: int) -> bool:
        return bool(self.ll.consume_token(token))

    def error(self) -> str:
        return str(self.ll.get_error())


class LLGuidanceEngine(GrammarEngine):
    name = "llguidance"

    def vocabulary(self, tokenizer: Tokenizer) -> Any:
        return ll_tokenizer(tokenizer)

    def compile(self, spec: GrammarSpec, vocabulary: Any) -> Any:
        matcher = llguidance.LLMatcher(vocabulary, ll_grammar(spec), log_level=0, limits=parser_limits())
        if matcher.is_error():
            raise InvalidRequest(spec.field, f"the {spec.kind} grammar cannot be used: "
                                 f"{first_lines(matcher.get_error())}")
        return matcher

    def new_matcher(self, template: Any) -> GuidedMatcher:
        return _Matcher(template.deep_copy())

    def fill_masks(self, matchers: Sequence[GuidedMatcher], bitmask: np.ndarray,
                   rows: Sequence[int]) -> None:
        lls = [m.ll for m in matchers]  # type: ignore[attr-defined]
        if len(lls) == 1:
            lln.fill_next_token_bitmask(lls[0], bitmask, rows[0])
            return
        lln.fill_next_token_bitmask_par(self.batch_worker(), list(zip(lls, rows, strict=True)), bitmask)

    def make_batch_worker(self) -> Any:
        return llguidance.LLExecutor(num_threads=1)
