"""The mistral.rs backend on a Hugging Face directory (the embedded model converted by
``ruvllm convert``): dynamic LoRA hot-load/unload with per-request selection, and in-situ
quantization quality against the unquantized weights."""

from __future__ import annotations

import itertools
import time

import pytest
from ruvllm.errors import InvalidRequest
from ruvllm.generation import GenerationStream, RequestOutputBuilder
from ruvllm.types import GenerationParams
from ruvllm_mistralrs import MistralRsBackend
from ruvllm_mistralrs.evaluation import forced_logprobs, perplexity

PROMPT = "The capital of France is"
#: Fixed text for the perplexity check (ordinary English the model predicts well).
TEXT = ("The sun rises in the east and sets in the west. Every morning, people wake up, eat "
        "breakfast and go to work.")
GREEDY = GenerationParams(max_tokens=8, ignore_eos=True)


def run(backend, ids, params=GREEDY, adapter=None):
    builder = RequestOutputBuilder(backend.tokenizer, ids, params)
    return GenerationStream(backend.generate(ids, params, adapter=adapter), builder).collect()


def test_hf_tokenizer_and_unquantized_output(lora_backend, hf_source):
    ids = lora_backend.tokenizer.encode(PROMPT)
    result = run(lora_backend, ids)
    assert len(result.token_ids) == 8 and result.text.startswith(" Paris")
    assert lora_backend.info.architecture == "llama" and lora_backend.info.parameters > 100_000_000


def test_lora_hot_load_changes_output_and_unload_restores_it(lora_backend, tmp_path, make_adapter):
    tok = lora_backend.tokenizer
    ids = tok.encode(PROMPT)
    base = run(lora_backend, ids)
    info = lora_backend.load_adapter("style", make_adapter(tmp_path / "style", seed=1))
    assert info.rank == 8 and info.bytes > 0
    with_adapter = run(lora_backend, ids, adapter="style")
    assert with_adapter.token_ids != base.token_ids, "a non-zero adapter must change greedy output"
    # Per-request selection: a request that names no adapter still runs the base model.
    assert run(lora_backend, ids).token_ids == base.token_ids
    # A second adapter, chosen per request, differs from the first.
    lora_backend.load_adapter("other", make_adapter(tmp_path / "other", seed=2))
    assert run(lora_backend, ids, adapter="other").token_ids != with_adapter.token_ids
    # Replacing an alias in place swaps its weights (new generation id) without a restart.
    replaced = lora_backend.load_adapter("style", tmp_path / "other")
    assert replaced.generation != info.generation
    swapped = run(lora_backend, ids, adapter="style").token_ids
    assert swapped == run(lora_backend, ids, adapter="other").token_ids
    lora_backend.unload_adapter("style")
    lora_backend.unload_adapter("other")
    assert run(lora_backend, ids).token_ids == base.token_ids, "unloading must restore the base output"
    with pytest.raises(InvalidRequest) as err:
        run(lora_backend, ids, adapter="style")
    assert err.value.field == "adapter"


def test_abandoned_adapter_request_releases_its_lease(lora_backend, tmp_path, make_adapter):
    """Closing a stream early ends the sequence inside mistral.rs: its adapter lease drops."""
    lora_backend.load_adapter("lease", make_adapter(tmp_path / "lease", seed=3))
    try:
        it = lora_backend.generate(lora_backend.tokenizer.encode(PROMPT),
                                   GenerationParams(max_tokens=200, ignore_eos=True), adapter="lease")
        next(it)
        assert lora_backend.adapter_leases() > 0  # mistral.rs holds one per request and sequence
        it.close()
        # The engine notices the dropped channel at its next step.
        deadline = time.monotonic() + 10
        while lora_backend.adapter_leases() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lora_backend.adapter_leases() == 0
    finally:
        lora_backend.unload_adapter("lease")


def test_bad_adapter_directory_is_refused(lora_backend, tmp_path):
    with pytest.raises(InvalidRequest) as err:
        lora_backend.load_adapter("x", tmp_path)
    assert err.value.field == "adapters"


def test_isq_q8_0_keeps_quality(lora_backend, hf_source):
    """Q8_0 in-situ quantization: same greedy tokens and perplexity within 5 % of the
    unquantized weights on a fixed text."""
    tok = lora_backend.tokenizer
    prefix, target = tok.encode(TEXT)[:1], tok.encode(TEXT)[1:]
    base_ppl = perplexity(forced_logprobs(lora_backend, prefix, target))
    base_out = run(lora_backend, tok.encode(PROMPT)).token_ids
    q = MistralRsBackend.load(hf_source, {"isq": "Q8_0", "threads": 1, "max_seqs": 4})
    try:
        assert q.serial_prefill and q.info.quantization == "Q8_0"
        q_ppl = perplexity(forced_logprobs(q, prefix, target))
        assert run(q, tok.encode(PROMPT)).token_ids == base_out
    finally:
        q.close()
    assert base_ppl < 50, f"unquantized perplexity {base_ppl:.2f} is implausible for plain English"
    assert abs(q_ppl / base_ppl - 1) < 0.05, f"Q8_0 perplexity {q_ppl:.3f} vs {base_ppl:.3f}"


def test_forced_scoring_matches_generated_logprobs(lora_backend):
    """Teacher-forced scoring of the greedy continuation reproduces the log-probabilities
    mistral.rs reports while generating it."""
    ids = lora_backend.tokenizer.encode(PROMPT)
    plain = run(lora_backend, ids, GenerationParams(max_tokens=3, logprobs=1, ignore_eos=True))
    forced = forced_logprobs(lora_backend, ids, list(plain.token_ids))
    # Scoring runs the continuation as one prefill, generation ran it one token at a time: the
    # float32 sums differ in order, which moves log-probabilities by ~2e-4 (measured).
    assert forced == pytest.approx([lp.logprob for lp in plain.logprobs], abs=1e-3)
    assert all(f < 0 for f in forced)


def test_engine_requests_choose_their_adapter(lora_backend, tmp_path, make_adapter):
    """Through the ServingEngine's request-level path (what the server uses): requests in
    flight together each run with the adapter their GenerationParams name, or the base model;
    an adapter that is not loaded is refused at submit time, and after an unload too."""
    import attrs
    from ruvllm.engine import EngineOptions, ServingEngine

    ids = lora_backend.tokenizer.encode(PROMPT)
    lora_backend.load_adapter("style", make_adapter(tmp_path / "style", seed=1))
    try:
        direct = run(lora_backend, ids, adapter="style").token_ids
        base = run(lora_backend, ids).token_ids
        assert direct != base
        options = EngineOptions(path="request", max_in_flight=4)
        engine = ServingEngine(lora_backend, options, owns_backend=False)
        try:
            choices = ["style", None, "style", None]
            handles = [engine.submit_sync(ids, attrs.evolve(GREEDY, adapter=a)) for a in choices]
            got = [h.result(timeout=120).token_ids for h in handles]
            assert got == [direct if a else base for a in choices]
            with pytest.raises(InvalidRequest) as err:
                engine.submit_sync(ids, attrs.evolve(GREEDY, adapter="nope"))
            assert err.value.field == "adapter"
            before = lora_backend.adapter_revision("style")
            engine.call(lambda: lora_backend.unload_adapter("style"))
            with pytest.raises(InvalidRequest):
                engine.submit_sync(ids, attrs.evolve(GREEDY, adapter="style"))
            assert lora_backend.adapter_names() == ()
            engine.call(lambda: lora_backend.load_adapter("style", tmp_path / "style"))
            assert lora_backend.adapter_revision("style") > before
        finally:
            engine.close()
    finally:
        if "style" in lora_backend.adapters:
            lora_backend.unload_adapter("style")


def test_lora_over_http_loads_lists_selects_and_unloads(lora_backend, tmp_path, make_adapter):
    """The server's LoRA surface on mistral.rs, as on candle_like (tests/server): vLLM's runtime
    endpoints behind the API key and the opt-in flag, the adapter listed with its parent, chosen
    per request with ``model=<adapter>`` and giving the backend's own output with that adapter."""
    from fastapi.testclient import TestClient
    from ruvllm.engine import EngineOptions, ServingEngine
    from ruvllm.server.app import ServerSettings, create_app

    ids = lora_backend.tokenizer.encode(PROMPT)
    path = make_adapter(tmp_path / "http", seed=4)
    lora_backend.load_adapter("probe", path)
    try:
        expected = run(lora_backend, ids, adapter="probe").text
    finally:
        lora_backend.unload_adapter("probe")
    auth = {"Authorization": "Bearer k"}
    engine = ServingEngine(lora_backend, EngineOptions(path="request", max_in_flight=4), owns_backend=False)
    settings = ServerSettings(model_name="smol", api_key="k", allow_runtime_lora=True)
    body = {"prompt": PROMPT, "max_tokens": GREEDY.max_tokens, "temperature": 0, "ignore_eos": True}
    with TestClient(create_app(engine, settings)) as client:
        load = {"lora_name": "http", "lora_path": str(path)}
        assert client.post("/v1/load_lora_adapter", json=load).status_code == 401
        r = client.post("/v1/load_lora_adapter", headers=auth, json=load)
        assert r.status_code == 200, r.text
        listed = {m["id"]: m for m in client.get("/v1/models", headers=auth).json()["data"]}
        assert listed["http"]["parent"] == "smol"
        tuned = client.post("/v1/completions", headers=auth, json={"model": "http", **body})
        base = client.post("/v1/completions", headers=auth, json={"model": "smol", **body})
        assert tuned.status_code == base.status_code == 200, (tuned.text, base.text)
        assert tuned.json()["choices"][0]["text"] == expected
        assert base.json()["choices"][0]["text"] != expected
        unload = client.post("/v1/unload_lora_adapter", headers=auth, json={"lora_name": "http"})
        assert unload.status_code == 200, unload.text
        gone = client.post("/v1/completions", headers=auth, json={"model": "http", **body})
        assert gone.status_code == 404
    assert lora_backend.adapter_names() == ()


#: Largest log-probability gap (nats) between candle_like's choice and mistral.rs's where their
#: greedy outputs first part: below it the two engines met a near tie, above it they disagree.
NEAR_TIE = 0.1


def first_tokens(backend, ids, params):
    """The backend's own first ``max_tokens`` steps (a backend's stream runs until its caller stops)."""
    stream = backend.generate(ids, params)
    try:
        return list(itertools.islice(stream, params.max_tokens))
    finally:
        stream.close()


def test_sona_default_adapter_from_candle_like_acts_the_same_on_mistralrs(lora_backend, embedded, tmp_path):
    """SONA trains on candle_like and saves PEFT; its default adapter is rank 2 on o_proj of the
    last 8 layers. mistral.rs loads that directory and applies it as candle_like does: with the
    same weights (both float32, from the same GGUF) the adapted greedy outputs agree up to a near
    tie, each differs from its engine's base output, and unloading restores mistral.rs's base."""
    import attrs
    import torch
    from ruvllm_candle_like.backend import CandleLikeBackend
    from ruvllm_candle_like.lora import build_adapter, projection_shapes

    candle = CandleLikeBackend.load(embedded, {"dtype": "float32"})
    cfg = candle.model.cfg
    out_f, in_f = projection_shapes(cfg)["o_proj"]
    g = torch.Generator().manual_seed(3)
    weights = {(layer, "o_proj"): (torch.randn(2, in_f, generator=g) * 0.3,
                                   torch.randn(out_f, 2, generator=g) * 0.3)
               for layer in range(cfg.num_layers - 8, cfg.num_layers)}
    adapter = build_adapter("sona", cfg, 2, 4.0, weights, dtype=candle.dtype, device=candle.device)
    path = adapter.save_peft(tmp_path / "sona", base_model="HuggingFaceTB/SmolLM2-135M-Instruct")
    candle.load_adapter("sona", path)
    ids = lora_backend.tokenizer.encode(PROMPT)
    scored = GenerationParams(max_tokens=8, ignore_eos=True, logprobs=5)
    candle_base = [t.token_id for t in first_tokens(candle, ids, scored)]
    steps = first_tokens(candle, ids, attrs.evolve(scored, adapter="sona"))
    candle_adapted = [t.token_id for t in steps]
    candle.close()
    assert candle_adapted != candle_base, "the adapter must move candle_like's greedy output"

    base = run(lora_backend, ids).token_ids
    info = lora_backend.load_adapter("sona", path)
    try:
        assert info.rank == 2
        adapted = list(run(lora_backend, ids, adapter="sona").token_ids)
    finally:
        lora_backend.unload_adapter("sona")
    assert adapted != list(base), "the adapter must move mistral.rs's greedy output"
    for k, (ours, theirs) in enumerate(zip(candle_adapted, adapted, strict=True)):
        if ours != theirs:
            top = dict(steps[k].top_logprobs)
            assert theirs in top and top[ours] - top[theirs] < NEAR_TIE, (
                f"token {k}: candle_like chose {ours}, mistral.rs {theirs} (candle_like's top: {top})")
            break
    assert run(lora_backend, ids).token_ids == base
