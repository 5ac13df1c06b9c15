"""Memory footprint: ``ruvllm serve --backend llamacpp`` on the embedded model stays small.

It held 2.1 GB resident: 1.6 GiB of KV (18 sequences x n_ctx 4096, allocated whole at start-up),
90 MiB of an unused request-level context and ~210 MB of torch imported by other plugins'
registration. Then 18 slices of 512 tokens met the bound and refused every longer request. The
executor's KV is now one pool of ``kv_budget_mib`` shared by every request (each may use the
model's whole context), the request-level context is created by the first ``generate()``, and
discovery imports no engine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.errors import BackendOptionError, InvalidRequest
from ruvllm.models import ModelSource
from ruvllm.types import GenerationParams
from ruvllm_llamacpp import LlamaCppBackend
from ruvllm_llamacpp.kv_pool import flash_attn_enabled, plan_pool

#: The embedded SmolLM2-135M: 30 layers x 3 KV heads x (64 + 64) dims x 2 bytes (f16).
SMOLLM2_KV_BYTES = 30 * 3 * 128 * 2
#: ``ruvllm serve`` measured 412 MB resident at idle with the defaults (docs/backends/llamacpp.md).
SERVE_RSS_LIMIT_MB = 500

SERVE = textwrap.dedent("""
    import json, re, sys
    from ruvllm.config import load_config
    from ruvllm.server.app import create_app
    from ruvllm.server.runner import load_engine, settings_for, startup_banner
    from ruvllm.types import GenerationParams

    # What `ruvllm serve [--backend B] [-o K=V]` does before uvicorn listens; argv: the config
    # overrides and backend options as JSON, and whether to serve one request before measuring.
    overrides, options, one_request = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3] == "1"
    config = load_config(overrides=overrides, backend_options=options)
    engine = load_engine(config)
    settings = settings_for(config, engine)
    create_app(engine, settings)
    if one_request:
        engine.submit_sync(engine.tokenizer.encode("Hello"), GenerationParams(max_tokens=4)).result()
    status = open("/proc/self/status").read()
    rss_kb, anon_kb, file_kb = (int(re.search(rf"{field}:\\s+(\\d+)", status).group(1))
                                for field in ("VmRSS", "RssAnon", "RssFile"))
    maps = open("/proc/self/maps").read()
    print(json.dumps({
        "backend": engine.backend_name,
        "rss_mb": rss_kb / 1024,
        # Which part grew, when the bound fails: the file-backed part moves with how the page cache
        # holds torch's library (up to ~110 MB, docs/architecture.md), the anonymous part with ruvllm.
        "rss_anon_mb": anon_kb / 1024, "rss_file_mb": file_kb / 1024,
        "engines": sorted(m for m in ("torch", "mlx", "mistralrs") if m in sys.modules),
        "optional_imports": sorted(m for m in ("httpx", "llguidance", "rich", "gguf") if m in sys.modules),
        "engine_libraries": sorted(lib for lib in ("libtorch_cpu", "libmlx", "mistralrs") if lib in maps),
        "banner": startup_banner(engine, settings),
        "context_length": engine.info.context_length,
    }))
    engine.close()
""")


def serve(cwd, *, overrides: dict, options: dict, one_request: bool) -> dict:
    """:data:`SERVE` in a fresh interpreter in ``cwd`` (no ruvllm.toml there: the defaults)."""
    out = subprocess.run([sys.executable, "-c", SERVE, json.dumps(overrides), json.dumps(options),
                          "1" if one_request else "0"], capture_output=True, text=True, timeout=300, cwd=cwd)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmRSS from /proc")
def test_the_default_server_idles_under_the_small_machine_bound(tmp_path):
    """Whichever backend ``auto`` picks here, ``ruvllm serve`` with no configuration idles under
    500 MB resident after a request (the project's small-machine promise): llamacpp, or
    candle_like where it claims the machine (ruvllm_candle_like.auto_claim; on the AVX-512 kind
    392-393 MB in a working venv, 482-483 MB in a fresh clone, whose page cache maps more of
    torch's library into the process, docs/architecture.md; llamacpp there 478 MB)."""
    result = serve(tmp_path, overrides={}, options={}, one_request=True)
    assert result["rss_mb"] < SERVE_RSS_LIMIT_MB, result
    # Imported by the first batch or grammar, not by every server (~10 MB resident with httpx's
    # rich and pygments: batch_lane.BatchLane.run); gguf only by the backend that reads its blocks.
    needed = {"gguf"} if result["backend"] == "candle_like" else set()
    assert set(result["optional_imports"]) <= needed, result


@pytest.fixture(scope="module")
def serve_process(tmp_path_factory) -> dict:
    """`ruvllm serve --backend llamacpp` up to listening, with default options but one thread."""
    if not sys.platform.startswith("linux"):
        pytest.skip("reads VmRSS from /proc")
    return serve(tmp_path_factory.mktemp("serve"), overrides={"backend": "llamacpp"},
                 options={"n_threads": 1}, one_request=False)


def test_serving_llamacpp_imports_no_other_engine(serve_process):
    assert serve_process["engines"] == []
    # Nor another plugin's helpers: gguf came with mistralrs' ISQ choice at registration (~3 MB).
    assert serve_process["optional_imports"] == []
    # Nor loads one's native library behind Python's back (the mlx plugin once mapped torch's
    # CPU library at discovery to speed up MLX's matmul: +100 MB resident here).
    assert serve_process["engine_libraries"] == []


def test_serve_stays_under_the_small_machine_bound(serve_process):
    assert serve_process["rss_mb"] < SERVE_RSS_LIMIT_MB, serve_process


def test_serve_states_the_pool_and_gives_one_request_the_whole_context(serve_process):
    banner = serve_process["banner"]
    # The embedded model was trained on 8,192 tokens: one request may use all of them.
    assert serve_process["context_length"] == 8192 and "up to 8192 tokens" in banner
    assert ("KV pool: 11520 tokens x 22.50 KiB (f16) = 253.1 MiB, shared by all requests; one "
            "request may use 8192 tokens, flash attention on (kv_budget_mib = 256)") in banner


# -- the plan -----------------------------------------------------------------------------------
def test_the_default_budget_on_the_embedded_model():
    pool = plan_pool(n_ctx=8192, sequences=18, bytes_per_token=SMOLLM2_KV_BYTES, budget_mib=256)
    assert (pool.tokens, pool.per_request, pool.total_bytes) == (11520, 8192, 11520 * SMOLLM2_KV_BYTES)
    assert not pool.over_budget and "lets one request use all of it" not in pool.describe()


def test_no_budget_or_a_large_one_gives_every_running_request_n_ctx():
    for budget in (0, 4096):
        pool = plan_pool(n_ctx=4096, sequences=18, bytes_per_token=SMOLLM2_KV_BYTES, budget_mib=budget)
        assert (pool.tokens, pool.per_request) == (18 * 4096, 4096)
    assert "kv_budget_mib = 0: no budget" in plan_pool(n_ctx=4096, sequences=1, bytes_per_token=1,
                                                       budget_mib=0).describe()


def test_a_budget_below_one_context_caps_a_request_and_says_what_lifts_it():
    big = 512 * 1024  # KV bytes per token of a 7B model without GQA
    pool = plan_pool(n_ctx=4096, sequences=18, bytes_per_token=big, budget_mib=256)
    assert (pool.tokens, pool.per_request) == (512, 512) and not pool.over_budget
    assert "the model's context is 4096 tokens, kv_budget_mib = 2048 lets one request use all of it" \
        in pool.describe()
    tiny = plan_pool(n_ctx=4096, sequences=18, bytes_per_token=big, budget_mib=64)
    assert tiny.tokens == 256 and tiny.over_budget and "exceeded" in tiny.describe()


def test_quantised_cells_hold_more_tokens_and_turn_flash_attention_on():
    q8 = plan_pool(n_ctx=8192, sequences=18, bytes_per_token=30 * 3 * 2 * 68, budget_mib=256,
                   type_k="q8_0", type_v="q8_0")
    assert q8.tokens == 21760 and "(q8_0)" in q8.describe() and "flash attention on" in q8.describe()


@pytest.mark.parametrize(("option", "pool_fa", "single_fa"), [
    ("auto", True, False), ("on", True, True), (True, True, True), ("off", False, False),
    (False, False, False)])
def test_flash_attn_auto_turns_it_on_for_the_shared_pool_only(option, pool_fa, single_fa):
    # A unified pool without it attends over every cell in use; generate()'s one sequence keeps
    # llama-cpp-python's default so its tokens match llama-cpp-python's.
    from ruvllm_llamacpp.options import LlamaCppOptions

    assert LlamaCppOptions().flash_attn == "auto"
    pool = plan_pool(n_ctx=8192, sequences=16, bytes_per_token=SMOLLM2_KV_BYTES, budget_mib=256,
                     flash_attn=option)
    assert pool.flash_attn is pool_fa
    assert flash_attn_enabled(option, shared_pool=False, type_v="f16") is single_fa
    assert ("flash attention on" in pool.describe()) is pool_fa
    assert flash_attn_enabled(option, shared_pool=False, type_v="q8_0")  # a quantised V needs it


def test_flash_attn_takes_llama_servers_words_and_booleans_only():
    with pytest.raises(BackendOptionError, match="flash_attn"):
        LlamaCppBackend.load(ModelSource.from_path(__file__), {"flash_attn": "yes"})


def test_no_sequences_is_rejected():
    with pytest.raises(InvalidRequest, match="max_sequences"):
        plan_pool(n_ctx=4096, sequences=0, bytes_per_token=1, budget_mib=256)


# -- the backend and its executor ---------------------------------------------------------------
@pytest.fixture(scope="module")
def backend(model_path):
    b = LlamaCppBackend.load(ModelSource.from_path(model_path),
                             {"n_ctx": 1024, "n_threads": 1, "kv_budget_mib": 20})
    yield b
    b.close()


def test_kv_bytes_per_token_is_the_models_attention_shape(backend):
    assert backend.kv_bytes_per_token == SMOLLM2_KV_BYTES


def test_the_executor_allocates_one_pool_of_the_budget(backend):
    # 20 MiB / 22.5 KiB = 910 tokens -> 768 (whole llama.cpp blocks), under the 1024-token context
    ex = backend.create_executor(max_sequences=3, block_size=16)
    try:
        assert (ex.pool.tokens, ex.max_sequences, ex.max_seq_len) == (768, 3, 768)
        assert backend.llama_cpp.llama_n_ctx(ex._ctx) == 768  # what llama.cpp really allocated
    finally:
        ex.close()
    options = EngineOptions(max_num_seqs=2, prefix_donor_slots=1)
    with ServingEngine(backend, options, owns_backend=False) as eng:
        # One request may use the pool, less the admission watermark (1 % of 48 blocks: none).
        assert eng.info.context_length == 768
        assert eng.metrics().kv_capacity_tokens == 768


def test_quantised_kv_cells_run_and_are_sized_by_their_type(model_path):
    b = LlamaCppBackend.load(ModelSource.from_path(model_path),
                             {"n_ctx": 1024, "n_threads": 1, "type_k": "q8_0", "type_v": "q8_0"})
    try:
        assert b.kv_bytes_per_token == 30 * 3 * 2 * 68 and b.flash_attn
        with ServingEngine(b, EngineOptions(max_num_seqs=2), owns_backend=False) as eng:
            out = eng.generate_sync(["The capital of France is"], GenerationParams(max_tokens=4))[0]
            assert out.usage.completion_tokens == 4 and out.text.strip()
    finally:
        b.close()


def test_the_request_level_context_is_created_by_the_first_generate(model_path):
    b = LlamaCppBackend.load(ModelSource.from_path(model_path), {"n_ctx": 300, "n_threads": 1})
    try:
        assert b._handles.ctx is None and b.memory_summary() is None
        assert b.n_ctx == b.info.context_length == 512  # padded to whole 256-cell blocks up front
        ex = b.create_executor(max_sequences=2, block_size=16)
        ex.close()
        assert b._handles.ctx is None  # the engine's executor does not need it
        # Two running sequences of a 512-token context: the pool holds both whole.
        assert b.memory_summary().startswith("KV pool: 1024 tokens x 22.50 KiB (f16) = 22.5 MiB")
        stream = b.generate(b.tokenizer.encode("Hello"), GenerationParams(max_tokens=3))
        next(stream)
        stream.close()
        assert b._handles.ctx is not None
        assert b.llama_cpp.llama_n_ctx(b.context_handle) == 512
        assert "request-level KV cache: 512 tokens x 1 sequence = 11.2 MiB" in b.memory_summary()
    finally:
        b.close()
