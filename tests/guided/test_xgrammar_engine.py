"""xgrammar as the grammar engine (``guided_decoding_backend = "xgrammar"``), on the real
ServingEngine with the llamacpp backend and the embedded SmolLM2 (temperature 0.8): outputs
validate, its masks agree with llguidance's where both define the same language, what it cannot
compile is a 400 naming the field, and the server selects it through the engine option.

The mask comparison rule (measured, stated in docs/structured-output.md): at a step where the
grammar leaves a choice, both engines allow exactly the same tokens. At a step where the grammar
forces text (llguidance's ``compute_ff_bytes`` is not empty), llguidance allows only the tokens
of that text's canonical tokenization, xgrammar every token that starts it: there llguidance's
set must be a subset of xgrammar's, and each token only xgrammar allows must be a prefix of the
forced bytes. JSON schemas with free strings are left out of the comparison: inside strings
xgrammar 0.2.8 allows no escapes in length-bounded strings and allows a raw DEL (both valid JSON,
different languages), as the last test shows.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import numpy as np
import openai
import pytest

if importlib.util.find_spec("xgrammar") is None:  # not importorskip: importing it takes ~5 s
    pytest.skip("xgrammar is not installed (see docs/structured-output.md)", allow_module_level=True)

from ruvllm.config import load_config
from ruvllm.engine import ServingEngine
from ruvllm.engine.options import EngineOptions
from ruvllm.errors import (
    EngineOptionError,
    InvalidRequest,
    UnsupportedByEngine,
)
from ruvllm.guided import GrammarCache, from_extensions, guided_processor, json_schema_grammar
from ruvllm.guided.processor import allowed_from_bitmask
from ruvllm.types import GenerationParams
from server_helpers import API_KEY, _require_backend, start_server

LARK = 'start: "x=" NUM ";"\nNUM: /[0-9]{1,3}/'
#: The same language in llama.cpp's GBNF: xgrammar compiles it itself, llguidance translated.
GBNF = 'root ::= "x=" num ";"\nnum ::= [0-9] [0-9]? [0-9]?'
# llguidance-only Lark: a terminal intersection ("&"), which xgrammar's dialect lacks.
LARK_LLGUIDANCE_ONLY = 'start: WORD\nWORD: /[a-z]+/ & /.{3}/'
REGEX = r" (yes|no), [a-z ]{3,20}\."
CHOICES = ["red", "green", "blue sky"]


def obj(**props) -> dict:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def ints(lo: int, hi: int) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi}


NAME = {"type": "string", "maxLength": 20}  # length-bounded: goes through the pattern rewrite
SCHEMAS = [
    obj(name=NAME, age=ints(0, 120)),
    obj(ok={"type": "boolean"}, color={"enum": ["red", "green", "blue"]}),
    obj(tags={"type": "array", "items": NAME, "minItems": 1, "maxItems": 3}),
    {"type": "array", "items": ints(1, 9), "minItems": 2, "maxItems": 4},
    obj(city=NAME, country={"type": "string", "pattern": "^[A-Z]{2}$"}),
    obj(user=obj(id=ints(0, 10**6), nick={"type": ["string", "null"], "maxLength": 12})),
    obj(answer={"enum": ["yes", "no", "maybe"]}, confidence_percent=ints(0, 100)),
    obj(date={"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}, count=ints(0, 9)),
]
# Same language under both engines (no free strings): compared mask by mask.
COMPARED = {
    "json_enum_bool_int": json_schema_grammar("guided_json", obj(
        ok={"type": "boolean"}, color={"enum": ["red", "green", "blue"]}, n=ints(-50, 50))),
    "json_int_array": json_schema_grammar("guided_json", {"type": "array", "items": ints(1, 99),
                                                          "minItems": 1, "maxItems": 4}),
    "regex": from_extensions(guided_regex=REGEX),
    "choice": from_extensions(guided_choice=CHOICES),
    "lark": from_extensions(guided_grammar=LARK),
    "gbnf": from_extensions(guided_grammar=GBNF),
}


@pytest.fixture(scope="module")
def engine():
    _require_backend("llamacpp")
    eng = ServingEngine.from_config(load_config(overrides={"backend": "llamacpp", "model": "default"}),
                                    options={"guided_decoding_backend": "xgrammar", "max_num_seqs": 16})
    yield eng
    eng.close()


def _generate(engine, spec, prompt: str, seeds, max_tokens: int = 96):
    """One constrained request per seed, all in flight together (one step fills all their
    masks), under the engine's grammar engine."""
    ids = engine.encode(prompt)
    handles = []
    for seed in seeds:
        proc = guided_processor(spec, engine.tokenizer, engine=engine.options.guided_decoding_backend)
        params = GenerationParams(max_tokens=max_tokens, temperature=0.8, seed=seed)
        handles.append(engine.submit_sync(ids, params, logits_processors=[proc]))
    return [h.result() for h in handles]


def test_json_schemas_validate_under_xgrammar(engine):
    specs = [json_schema_grammar("guided_json", s) for s in SCHEMAS]
    ids = engine.encode("Reply with a JSON value for this task.")
    handles = []
    for seed, spec in enumerate(specs):
        proc = guided_processor(spec, engine.tokenizer, engine="xgrammar")
        handles.append((SCHEMAS[seed], engine.submit_sync(
            ids, GenerationParams(max_tokens=100, temperature=0.8, seed=seed), logits_processors=[proc])))
    for schema, handle in handles:
        r = handle.result()
        assert r.finish_reason.value == "stop", (schema, r.text)
        jsonschema.validate(json.loads(r.text), schema)


def test_regex_choice_and_lark_under_xgrammar(engine):
    for r in _generate(engine, from_extensions(guided_regex=REGEX), "Is water wet? Answer:", range(3), 40):
        assert re.fullmatch(REGEX, r.text), r.text
    for r in _generate(engine, from_extensions(guided_choice=CHOICES), "Pick a color:", range(3), 10):
        assert r.text in CHOICES
    for grammar in (LARK, GBNF):
        for r in _generate(engine, from_extensions(guided_grammar=grammar), "Assign x.", range(3), 12):
            assert re.fullmatch(r"x=[0-9]{1,3};", r.text), r.text


def _walk(spec, tokenizer, seed: int, steps: int = 48):
    """Walk one random path that both engines allow, yielding both allowed sets and
    llguidance's forced bytes at every step."""
    rng = np.random.default_rng(seed)
    ll = guided_processor(spec, tokenizer, engine="llguidance")
    xg = guided_processor(spec, tokenizer, engine="xgrammar")
    out: list[int] = []
    for _ in range(steps):
        a = allowed_from_bitmask(ll.mask(out), tokenizer.vocab_size)
        b = allowed_from_bitmask(xg.mask(out), tokenizer.vocab_size)
        yield a, b, bytes(ll.matcher.ll.compute_ff_bytes())
        both = np.flatnonzero(a & b)
        assert len(both), "no token both engines allow"
        token = int(rng.choice(both))
        if token in tokenizer.eos_ids:
            return
        out.append(token)


@pytest.mark.parametrize("name", sorted(COMPARED))
def test_masks_agree_with_llguidance(engine, name):
    tok = engine.tokenizer
    free_steps = 0
    for seed in range(3):
        for a, b, forced in _walk(COMPARED[name], tok, seed):
            if not forced:
                free_steps += 1
                assert np.array_equal(a, b), (name, np.flatnonzero(a ^ b)[:10])
                continue
            assert not (a & ~b).any(), "llguidance allows a token xgrammar refuses"
            for t in np.flatnonzero(b & ~a):
                piece = tok.decode_bytes([int(t)], skip_special=False)
                assert forced.startswith(piece), (name, piece, forced)
    assert free_steps >= 3, "the walk never reached a step with a choice"


def test_lark_only_llguidance_accepts_is_refused_naming_field_and_engine(engine):
    spec = from_extensions(guided_grammar=LARK_LLGUIDANCE_ONLY)
    with pytest.raises(UnsupportedByEngine) as info:
        guided_processor(spec, engine.tokenizer, engine="xgrammar")
    err = info.value
    assert isinstance(err, InvalidRequest) and err.field == "guided_grammar"
    assert err.engine == "xgrammar" and err.accepted_by == "llguidance"
    assert "guided_decoding_backend=llguidance" in str(err)
    guided_processor(spec, engine.tokenizer, engine="llguidance")  # the claim holds: it compiles there
    with pytest.raises(InvalidRequest) as info:  # broken for both: a plain 400, not "use llguidance"
        guided_processor(from_extensions(guided_grammar='start: "a" ('), engine.tokenizer, engine="xgrammar")
    assert info.value.field == "guided_grammar" and not isinstance(info.value, UnsupportedByEngine)


def test_unusable_schema_and_time_limit_are_400s_and_the_cache_keys_on_the_engine(engine):
    tok = engine.tokenizer
    with pytest.raises(InvalidRequest) as info:
        guided_processor(json_schema_grammar("response_format.json_schema.schema", {"type": "bogus"}),
                         tok, engine="xgrammar")
    assert info.value.field == "response_format.json_schema.schema"
    # xgrammar precomputes masks when it compiles (~0.15 s here for a bounded string): 10 ms is
    # far too little.
    fresh = json_schema_grammar("guided_json", obj(label={"type": "string", "maxLength": 21}))
    with pytest.raises(InvalidRequest, match=r"did not compile within 0\.01 s \(xgrammar\)") as info:
        guided_processor(fresh, tok, engine="xgrammar", cache=GrammarCache(timeout=0.01))
    assert info.value.field == "guided_json"
    cache = GrammarCache()
    for _ in range(2):
        guided_processor(fresh, tok, engine="xgrammar", cache=cache)
    assert (cache.misses, cache.hits) == (1, 1)
    guided_processor(fresh, tok, engine="llguidance", cache=cache)
    assert cache.misses == 2  # same schema, other engine: its own entry


def test_length_bounded_strings_use_xgrammar_json_aware_pattern_path(engine):
    """xgrammar 0.2.8's own minLength/maxLength lowering admits a raw TAB (invalid JSON;
    mlc-ai/xgrammar#800): ruvllm rewrites such strings to a pattern. The first assertion is a
    tripwire for the pin: when xgrammar fixes its lowering, drop the rewrite."""
    import xgrammar
    from ruvllm.guided.xgrammar_engine import length_bounds_as_patterns

    tok = engine.tokenizer
    tab = next(i for i in range(tok.vocab_size) if tok.decode_bytes([i], skip_special=False) == b"\t")
    vocab = xgrammar_vocabulary(tok)
    schema = json.dumps({"type": "string", "maxLength": 8})
    raw = xgrammar.GrammarMatcher(vocab.compiler.compile_json_schema(schema, any_whitespace=False))
    assert raw.accept_token(tok.encode('"', add_special=False)[0])
    bitmask = np.zeros((1, (tok.vocab_size + 31) // 32), dtype=np.int32)
    raw.fill_next_token_bitmask(bitmask)
    assert allowed_from_bitmask(bitmask[0], tok.vocab_size)[tab], "xgrammar fixed #800: drop the rewrite"
    assert json.loads(length_bounds_as_patterns(schema)) == {"type": "string", "pattern": "^.{0,8}$"}
    proc = guided_processor(json_schema_grammar("guided_json", json.loads(schema)), tok, engine="xgrammar")
    allowed = allowed_from_bitmask(proc.mask(tok.encode('"', add_special=False)), tok.vocab_size)
    assert not allowed[tab]
    assert vocab is xgrammar_vocabulary(tok)  # built once per tokenizer


def xgrammar_vocabulary(tokenizer):
    from ruvllm.guided.engine import get_engine

    return get_engine("xgrammar").vocabulary(tokenizer)


def test_option_is_validated_and_xgrammar_stays_unimported_until_used():
    with pytest.raises(EngineOptionError, match="guided_decoding_backend"):
        EngineOptions(guided_decoding_backend="outlines")
    script = ("import sys; from ruvllm.engine.options import EngineOptions; import ruvllm.server.app; "
              "o = EngineOptions.from_mapping({'guided_decoding_backend': 'xgrammar'}); "
              "print(o.guided_decoding_backend, 'xgrammar' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         check=True)
    assert out.stdout.split() == ["xgrammar", "False", "False"], out.stderr


def test_serve_cli_passes_the_option_to_the_engine_options():
    """``ruvllm serve -e guided_decoding_backend=...`` reaches EngineOptions before any weights
    are read: a wrong value ends the command with the option's error."""
    ruvllm = Path(sys.executable).parent / "ruvllm"
    proc = subprocess.run([str(ruvllm), "serve", "--backend", "llamacpp", "--port", "0",
                           "-e", "guided_decoding_backend=outlines"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "engine.guided_decoding_backend" in proc.stderr and "Uvicorn running" not in proc.stderr


@pytest.fixture(scope="module")
def xgrammar_server():
    running = start_server(engine_options={"guided_decoding_backend": "xgrammar"},
                           server={"max_tokens_limit": 512})
    yield running
    running.stop()


def test_server_with_xgrammar_option(xgrammar_server):
    assert xgrammar_server.engine.options.guided_decoding_backend == "xgrammar"
    client = openai.OpenAI(base_url=xgrammar_server.base_url, api_key=API_KEY, max_retries=0, timeout=280)
    model = client.models.list().data[0].id
    schema = SCHEMAS[0]

    def ask(seed: int):
        return client.chat.completions.create(
            model=model, temperature=0.8, max_tokens=80, seed=seed,
            messages=[{"role": "user", "content": "Invent a person."}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "p", "schema": schema, "strict": True}})

    with ThreadPoolExecutor(4) as pool:
        for r in pool.map(ask, range(4)):
            assert r.choices[0].finish_reason == "stop"
            jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.completions.create(model=model, prompt="Is water wet? Answer:", max_tokens=40, temperature=0.8,
                                  extra_body={"guided_regex": REGEX})
    assert re.fullmatch(REGEX, r.choices[0].text), r.choices[0].text
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, max_tokens=8,
                                       messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"guided_grammar": LARK_LLGUIDANCE_ONLY})
    assert info.value.body["param"] == "guided_grammar"
    assert "llguidance" in info.value.body["message"], info.value.body
