"""Memory footprint: ``ruvllm serve --backend llamacpp`` on the embedded model stays small.

It held 2.1 GB resident: 1.6 GiB of KV (18 sequences x n_ctx 4096, allocated whole at start-up),
90 MiB of an unused request-level context and ~210 MB of torch imported by other plugins'
registration. The executor's KV now comes from ``kv_budget_mib``, the request-level context is
created by the first ``generate()``, and discovery imports no engine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.errors import InvalidRequest
from ruvllm.models import ModelSource
from ruvllm.types import GenerationParams
from ruvllm_llamacpp import LlamaCppBackend
from ruvllm_llamacpp.kv_budget import MIB, plan_kv

#: The embedded SmolLM2-135M: 30 layers x 3 KV heads x (64 + 64) dims x 2 bytes (f16).
SMOLLM2_KV_BYTES = 30 * 3 * 128 * 2
#: ``ruvllm serve`` measured 412 MB resident at idle with the defaults (docs/backends/llamacpp.md).
SERVE_RSS_LIMIT_MB = 500

SERVE_PATH = textwrap.dedent("""
    import json, re, sys
    from ruvllm.config import load_config
    from ruvllm.server.app import create_app
    from ruvllm.server.runner import load_engine, settings_for, startup_banner

    # What `ruvllm serve --backend llamacpp` does before uvicorn listens, with default options.
    config = load_config(overrides={"backend": "llamacpp"}, backend_options={"n_threads": 1})
    engine = load_engine(config)
    settings = settings_for(config, engine)
    create_app(engine, settings)
    rss_kb = int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
    maps = open("/proc/self/maps").read()
    print(json.dumps({
        "rss_mb": rss_kb / 1024,
        "engines": sorted(m for m in ("torch", "mlx", "mistralrs") if m in sys.modules),
        "engine_libraries": sorted(lib for lib in ("libtorch_cpu", "libmlx", "mistralrs") if lib in maps),
        "banner": startup_banner(engine, settings),
        "context_length": engine.info.context_length,
    }))
    engine.close()
""")


@pytest.fixture(scope="module")
def serve_process(tmp_path_factory) -> dict:
    """The serve start-up path in a fresh interpreter (no ruvllm.toml: the defaults)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("reads VmRSS from /proc")
    out = subprocess.run([sys.executable, "-c", SERVE_PATH], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path_factory.mktemp("serve"))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_serving_llamacpp_imports_no_other_engine(serve_process):
    assert serve_process["engines"] == []
    # Nor loads one's native library behind Python's back (the mlx plugin once mapped torch's
    # CPU library at discovery to speed up MLX's matmul: +100 MB resident here).
    assert serve_process["engine_libraries"] == []


def test_serve_stays_under_the_small_machine_bound(serve_process):
    assert serve_process["rss_mb"] < SERVE_RSS_LIMIT_MB, serve_process


def test_serve_states_the_kv_budget_and_the_window(serve_process):
    banner = serve_process["banner"]
    assert "up to 512 tokens" in banner and serve_process["context_length"] == 512
    assert "KV cache: 512 tokens x 18 sequences = 202.5 MiB (kv_budget_mib = 256" in banner
    assert "kv_budget_mib = 1620 gives every sequence all of it" in banner


# -- the plan -----------------------------------------------------------------------------------
def test_the_default_budget_on_the_embedded_model():
    kv = plan_kv(n_ctx=4096, sequences=18, bytes_per_token=SMOLLM2_KV_BYTES, budget_mib=256)
    assert (kv.tokens, kv.sequences, kv.total_bytes) == (512, 18, int(202.5 * MIB))
    assert not kv.over_budget


def test_no_budget_or_a_large_one_gives_every_sequence_n_ctx():
    for budget in (0, 2048):
        kv = plan_kv(n_ctx=4096, sequences=18, bytes_per_token=SMOLLM2_KV_BYTES, budget_mib=budget)
        assert (kv.tokens, kv.sequences) == (4096, 18)
    assert "kv_budget_mib = 0: no budget" in plan_kv(n_ctx=4096, sequences=1, bytes_per_token=1,
                                                     budget_mib=0).describe()


def test_a_budget_too_small_for_every_sequence_keeps_fewer_and_says_so():
    big = 512 * 1024  # KV bytes per token of a 7B model without GQA
    kv = plan_kv(n_ctx=4096, sequences=18, bytes_per_token=big, budget_mib=256)
    assert (kv.tokens, kv.sequences) == (256, 2) and not kv.over_budget
    assert "only 2 of the 18 sequences asked for fit" in kv.describe()
    tiny = plan_kv(n_ctx=4096, sequences=18, bytes_per_token=big, budget_mib=64)
    assert (tiny.tokens, tiny.sequences) == (256, 1) and tiny.over_budget
    assert "exceeded" in tiny.describe()


def test_no_sequences_is_rejected():
    with pytest.raises(InvalidRequest, match="max_sequences"):
        plan_kv(n_ctx=4096, sequences=0, bytes_per_token=1, budget_mib=256)


# -- the backend and its executor ---------------------------------------------------------------
@pytest.fixture(scope="module")
def backend(model_path):
    b = LlamaCppBackend.load(ModelSource.from_path(model_path),
                             {"n_ctx": 1024, "n_threads": 1, "kv_budget_mib": 20})
    yield b
    b.close()


def test_kv_bytes_per_token_is_the_models_attention_shape(backend):
    assert backend.kv_bytes_per_token == SMOLLM2_KV_BYTES


def test_the_executor_allocates_what_the_budget_allows(backend):
    # 20 MiB / (3 sequences x 22.5 KiB) = 303 tokens -> 256 (whole llama.cpp blocks)
    ex = backend.create_executor(max_sequences=3, block_size=16)
    try:
        assert (ex.kv.tokens, ex.max_sequences, ex.max_seq_len) == (256, 3, 256)
        assert backend.llama_cpp.llama_n_ctx(ex._ctx) == 3 * 256  # what llama.cpp really allocated
    finally:
        ex.close()
    options = EngineOptions(max_num_seqs=2, prefix_donor_slots=1)
    with ServingEngine(backend, options, owns_backend=False) as eng:
        assert eng.info.context_length == 256


def test_the_request_level_context_is_created_by_the_first_generate(model_path):
    b = LlamaCppBackend.load(ModelSource.from_path(model_path), {"n_ctx": 300, "n_threads": 1})
    try:
        assert b._handles.ctx is None and b.memory_summary() is None
        assert b.n_ctx == b.info.context_length == 512  # padded to whole 256-cell blocks up front
        ex = b.create_executor(max_sequences=2, block_size=16)
        ex.close()
        assert b._handles.ctx is None  # the engine's executor does not need it
        assert b.memory_summary().startswith("KV cache: 512 tokens x 2 sequences = 22.5 MiB")
        stream = b.generate(b.tokenizer.encode("Hello"), GenerationParams(max_tokens=3))
        next(stream)
        stream.close()
        assert b._handles.ctx is not None
        assert b.llama_cpp.llama_n_ctx(b.context_handle) == 512
        assert "request-level KV cache: 512 tokens x 1 sequence = 11.2 MiB" in b.memory_summary()
    finally:
        b.close()
