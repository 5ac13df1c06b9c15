"""What a request asks its output to match: a language and its source text, engine-neutral.

Every request-level way of constraining output (OpenAI's ``response_format``, vLLM's
``structured_outputs`` and the ``guided_regex`` / ``guided_grammar`` / ``guided_choice`` /
``guided_json`` fields it replaced, an enforced tool call) ends here as a :class:`GrammarSpec`:
the field it came from (named in every error), the language (JSON schema, regex or Lark) and
its source. The selected grammar engine (:mod:`ruvllm.guided.engine`) turns it into its own
grammar when it compiles, in :mod:`ruvllm.guided.compile`, where the tokenizer is known; a
source an engine cannot use is a 400 naming the field there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ruvllm.errors import InvalidRequest

#: The languages a GrammarSpec can be written in.
LANGUAGES = ("json_schema", "regex", "lark", "gbnf")


@attrs.frozen
class GrammarSpec:
    """One request's output constraint."""

    #: The request field the constraint came from (``response_format``, ``tools``...).
    field: str
    #: Short description for logs and errors ("json_schema 'weather'", "regex").
    kind: str
    #: ``json_schema`` (source: the schema as JSON text), ``regex``, ``lark`` (llguidance's
    #: Lark dialect; xgrammar documents its own as compatible with it) or ``gbnf`` (llama.cpp's
    #: grammar format, which xgrammar compiles as its EBNF and llguidance translates to Lark).
    language: str = attrs.field(validator=attrs.validators.in_(LANGUAGES))
    source: str


#: Keywords whose values are subschemas (one, a list, or a name -> schema map).
_ONE = ("items", "additionalItems", "contains", "not", "if", "then", "else", "propertyNames")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def strict_objects(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object that names its properties
    and does not say otherwise: the strict default of llama.cpp's json-schema-to-grammar and of
    xgrammar (``strict_mode``). Under JSON Schema's own default (any extra key allowed) a small
    model fills a tool call's arguments with invented keys until ``max_tokens``."""
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    if "properties" in out and "additionalProperties" not in out and "unevaluatedProperties" not in out:
        out["additionalProperties"] = False
    for key in _ONE:
        if key in out:
            out[key] = strict_objects(out[key])
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [strict_objects(s) for s in out[key]]
    for key in _MAP:
        if isinstance(out.get(key), Mapping):
            out[key] = {name: strict_objects(s) for name, s in out[key].items()}
    if isinstance(out.get("additionalProperties"), Mapping):
        out["additionalProperties"] = strict_objects(out["additionalProperties"])
    return out


def json_schema_grammar(field: str, schema: Any, *, kind: str = "json_schema") -> GrammarSpec:
    """A grammar for JSON matching ``schema`` (a dict), checked by the engine when it compiles:
    llguidance refuses unsupported keywords rather than ignoring them, so that ``strict`` output
    really validates; xgrammar ignores a few (docs/structured-output.md lists them). Objects are
    closed unless the schema opens them (:func:`strict_objects`)."""
    if not isinstance(schema, Mapping):
        raise InvalidRequest(field, f"the JSON schema must be an object; got {type(schema).__name__}")
    try:
        source = json.dumps(strict_objects(schema))
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(field, f"is not a usable JSON schema: {exc}") from exc
    return GrammarSpec(field, kind, "json_schema", source)


def from_response_format(response_format: Mapping[str, Any] | None) -> GrammarSpec | None:
    """OpenAI's ``response_format``: ``text`` (no constraint), ``json_object``, ``json_schema``."""
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return json_schema_grammar("response_format", {"type": "object"}, kind="json_object")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping):
            raise InvalidRequest("response_format.json_schema",
                                 "is required with type json_schema: {\"name\": ..., \"schema\": {...}}")
        schema = spec.get("schema")
        if schema is None:
            # OpenAI accepts a json_schema without a schema: any JSON object.
            schema = {"type": "object"}
        name = spec.get("name") or "unnamed"
        return json_schema_grammar("response_format.json_schema.schema", schema,
                                   kind=f"json_schema {name!r}")
    raise InvalidRequest("response_format",
                         f"type must be one of text, json_object, json_schema; got {kind!r}")


def from_extensions(*, guided_regex: str | None = None, guided_grammar: str | None = None,
                    guided_choice: Sequence[str] | None = None,
                    guided_json: Any = None) -> GrammarSpec | None:
    """vLLM's extension fields (at most one may be set): a regex, a grammar (llguidance's Lark
    dialect, which also embeds ``%json`` schemas, or llama.cpp's GBNF; xgrammar takes the part of
    Lark its own dialect shares), a list of choices or a JSON schema."""
    return _one_constraint({"guided_regex": ("regex", guided_regex),
                            "guided_grammar": ("grammar", guided_grammar),
                            "guided_choice": ("choice", guided_choice), "guided_json": ("json", guided_json)})


def from_structured_outputs(*, json_schema: Any = None, regex: str | None = None,
                            choice: Sequence[str] | None = None, grammar: str | None = None,
                            json_object: bool | None = None) -> GrammarSpec | None:
    """vLLM's ``structured_outputs`` object (its spelling since v0.12, which removed the
    ``guided_*`` fields): ``json``, ``regex``, ``choice`` and ``grammar`` as those fields,
    ``json_object: true`` as ``response_format``'s; at most one."""
    prefix = "structured_outputs."
    return _one_constraint({prefix + "json": ("json", json_schema), prefix + "regex": ("regex", regex),
                            prefix + "choice": ("choice", choice), prefix + "grammar": ("grammar", grammar),
                            prefix + "json_object": ("json_object", json_object or None)})


def _one_constraint(given: Mapping[str, tuple[str, Any]]) -> GrammarSpec | None:
    """The constraint of the one field set (field -> (what it holds, value)); None if none is."""
    present = {field: kv for field, kv in given.items() if kv[1] is not None}
    if not present:
        return None
    if len(present) > 1:
        raise InvalidRequest(sorted(present)[1], f"give only one of {', '.join(sorted(present))}")
    (field, (what, value)), = present.items()
    if what == "regex":
        if not isinstance(value, str) or not value:
            raise InvalidRequest(field, "must be a non-empty regular expression string")
        return GrammarSpec(field, "regex", "regex", value)
    if what == "grammar":
        if not isinstance(value, str) or not value.strip():
            raise InvalidRequest(field, "must be a non-empty Lark or GBNF grammar string")
        # Imported by the first grammar, not by every server (llguidance: ~6 MB resident).
        from llguidance.gbnf_to_lark import is_lark_syntax

        language = "lark" if is_lark_syntax(value) else "gbnf"
        return GrammarSpec(field, language, language, value)
    if what == "choice":
        if not value or not all(isinstance(c, str) and c for c in value):
            raise InvalidRequest(field, "must be a non-empty list of non-empty strings")
        # JSON string escapes are Lark's (both engines' dialects) string-literal escapes.
        lark = "start: " + " | ".join(json.dumps(c) for c in value)
        return GrammarSpec(field, "choice", "lark", lark)
    if what == "json_object":
        return json_schema_grammar(field, {"type": "object"}, kind="json_object")
    try:
        schema = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError as exc:
        raise InvalidRequest(field, f"is not valid JSON: {exc}") from exc
    return json_schema_grammar(field, schema)
