"""xgrammar behind the grammar-engine contract (``guided_decoding_backend = "xgrammar"``).

Imported only when selected: ``import xgrammar`` pulls in torch and transformers (~5 s and
~250 MB RSS on the test machines). Its vocabulary is built from the same exact token bytes as
llguidance's (``VocabType.RAW``); control tokens are given no bytes, which xgrammar treats as
special tokens that no grammar text can produce, and the model's EOS ids are its stop tokens.

xgrammar precomputes a grammar's token masks when it compiles (measured at 49k tokens: ~1 ms for
a schema of integers, ~0.15-0.2 s for one length-bounded string or a small regex, ~1.2-1.6 s
for ten bounded strings; llguidance: ~3 ms), so the compile cache matters more here; a matcher
made from a compiled grammar is cheap. JSON is generated compactly (separators
``,`` and ``:``, no optional whitespace) in xgrammar's strict mode (no properties or items the
schema does not name), as vLLM does. ``guided_grammar`` goes through xgrammar's Lark dialect,
which its documentation says is compatible with llguidance's; what it does not support
(``%llguidance``, terminal ``&``/``~`` operators, ...) is refused with
:class:`~ruvllm.errors.UnsupportedByEngine` pointing to llguidance.

xgrammar 0.2.8 lowers a string with ``minLength``/``maxLength`` to a repetition of "any
character but a quote, a backslash, CR or LF", which admits raw control characters (a TAB:
invalid JSON) and no escapes (mlc-ai/xgrammar#800, open). Its ``pattern`` path is JSON-aware,
so such strings are given the equivalent pattern ``^.{m,n}$`` instead
(:func:`length_bounds_as_patterns`): the output stays valid JSON, and those strings hold no
escaped characters (quotes, backslashes, newlines), as before. (A ``pattern`` together with
length bounds makes xgrammar ignore the bounds, with a warning on stderr.)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import xgrammar

from ruvllm.errors import InvalidRequest, UnsupportedByEngine
from ruvllm.guided.engine import GrammarEngine, GuidedMatcher, first_lines
from ruvllm.guided.grammar import GrammarSpec
from ruvllm.guided.tokenizer import cached_view, require_eos, token_byte_table
from ruvllm.tokenizer import Tokenizer


@attrs.frozen
class XGrammarVocabulary:
    """One tokenizer's ``TokenizerInfo`` and the compiler bound to it."""

    info: Any
    compiler: Any


def _build_vocabulary(tokenizer: Tokenizer) -> XGrammarVocabulary:
    require_eos(tokenizer)
    table = token_byte_table(tokenizer, special_prefix=None)
    info = xgrammar.TokenizerInfo(table, xgrammar.VocabType.RAW, vocab_size=len(table),
                                  stop_token_ids=list(tokenizer.eos_ids))
    # ruvllm's GrammarCache keeps compiled grammars (keyed by engine and source), so xgrammar's
    # own cache would only hold a second copy. Two compile threads: the machine's cores are
    # shared with the forward pass.
    return XGrammarVocabulary(info, xgrammar.GrammarCompiler(info, max_threads=2, cache_enabled=False))


class _Matcher:
    """A ``GrammarMatcher`` seen through :class:`~ruvllm.guided.engine.GuidedMatcher`."""

    __slots__ = ("refused", "xg")

    def __init__(self, xg: Any):
        self.xg = xg
        self.refused: int | None = None

    def consume_token(self, token: int) -> bool:
        ok = bool(self.xg.accept_token(token))
        if not ok:
            self.refused = token
        return ok

    def error(self) -> str:
        return f"xgrammar's matcher refused token {self.refused}"


class XGrammarEngine(GrammarEngine):
    name = "xgrammar"

    def vocabulary(self, tokenizer: Tokenizer) -> XGrammarVocabulary:
        return cached_view(tokenizer, "xgrammar", _build_vocabulary)

    def compile(self, spec: GrammarSpec, vocabulary: XGrammarVocabulary) -> Any:
        compiler = vocabulary.compiler
        try:
            if spec.language == "json_schema":
                return compiler.compile_json_schema(length_bounds_as_patterns(spec.source),
                                                    any_whitespace=False,
                                                    separators=(",", ":"), strict_mode=True)
            if spec.language == "regex":
                return compiler.compile_regex(spec.source)
            if spec.language == "gbnf":
                return compiler.compile_grammar(spec.source)  # xgrammar's EBNF is llama.cpp's GBNF
            return compiler.compile_lark(spec.source)
        except (RuntimeError, ValueError, TypeError) as exc:
            reason = first_lines(str(exc))
            if spec.language == "lark" and _llguidance_accepts(spec):
                raise UnsupportedByEngine(
                    spec.field, "xgrammar", "llguidance",
                    f"xgrammar's Lark dialect cannot compile this grammar ({reason})") from None
            what = "JSON schema" if spec.language == "json_schema" else f"{spec.kind} grammar"
            raise InvalidRequest(spec.field, f"is not a usable {what} for xgrammar: {reason}") from None

    def portable(self, template: Any) -> str:
        # Measured: a 13 MB form for a 2.6 s compile (a long pattern) costs ~0.7 s to write and read.
        return template.serialize_json()

    def from_portable(self, data: str, vocabulary: XGrammarVocabulary) -> Any:
        return xgrammar.CompiledGrammar.deserialize_json(data, vocabulary.info)

    def new_matcher(self, template: Any) -> GuidedMatcher:
        return _Matcher(xgrammar.GrammarMatcher(template))

    def fill_masks(self, matchers: Sequence[GuidedMatcher], bitmask: np.ndarray,
                   rows: Sequence[int]) -> None:
        xgs = [m.xg for m in matchers]  # type: ignore[attr-defined]
        if len(xgs) == 1:
            xgs[0].fill_next_token_bitmask(bitmask, rows[0])
            return
        self.batch_worker().batch_fill_next_token_bitmask(xgs, bitmask, list(rows))

    def make_batch_worker(self) -> Any:
        return xgrammar.BatchGrammarMatcher(max_threads=1)


#: Keys whose values are data, not subschemas (a ``const`` may look like a schema).
_DATA_KEYS = frozenset({"const", "enum", "default", "examples", "example"})


def length_bounds_as_patterns(schema_json: str) -> str:
    """``schema_json`` with every string subschema bounded by ``minLength``/``maxLength`` and
    without a ``pattern`` or ``format`` given the pattern ``^.{min,max}$`` instead (see the
    module's docstring for why); other schemas are returned unchanged."""
    try:
        schema = json.loads(schema_json)
    except ValueError:
        return schema_json  # xgrammar reports it
    changed = [False]

    def visit(node: Any) -> Any:
        if isinstance(node, list):
            return [visit(v) for v in node]
        if not isinstance(node, dict):
            return node
        out = {k: (v if k in _DATA_KEYS else visit(v)) for k, v in node.items()}
        types = out.get("type")
        is_string = types == "string" or (isinstance(types, list) and "string" in types)
        bounded = "minLength" in out or "maxLength" in out
        if is_string and bounded and "pattern" not in out and "format" not in out:
            low, high = out.pop("minLength", 0), out.pop("maxLength", None)
            out["pattern"] = f"^.{{{int(low)},{'' if high is None else int(high)}}}$"
            changed[0] = True
        return out

    rewritten = visit(schema)
    return json.dumps(rewritten) if changed[0] else schema_json


def _llguidance_accepts(spec: GrammarSpec) -> bool:
    """Whether llguidance (always installed) can use this grammar: then the user's fix is to
    select it, rather than to change the grammar."""
    import llguidance

    from ruvllm.guided.llguidance_engine import ll_grammar

    try:
        return not llguidance.LLMatcher.validate_grammar(ll_grammar(spec))
    except InvalidRequest:
        return False
