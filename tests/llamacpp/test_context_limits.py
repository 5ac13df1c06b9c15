"""No llama.cpp context parameter at its limits takes the process down.

llama.cpp checks some context parameters with ``GGML_ASSERT``, which aborts the process: ``ruvllm
serve -o n_batch=32`` died at start-up with rc 134 (``GGML_ASSERT(n_outputs_max <=
cparams.n_outputs_max)``: llama.cpp reserves a logits row per sequence, capped at n_batch rows,
and the executor holds 16 running plus 64 parked sequences). Each case below runs in one child
process (context_limits_child.py) through generate(), the serving engine with chunked prefill and
embeddings; a case may be refused with a typed error, but a native abort fails the test naming it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("context_limits_child.py")

CASES = [
    ({"n_batch": 32}, {"max_num_seqs": 16}),            # the start-up abort: 80 sequences, 32 rows
    ({"n_batch": 8}, {"max_num_seqs": 250}),            # llama.cpp's 256 sequences, 8-token steps
    ({"n_batch": 1}, {"max_num_seqs": 4}),
    ({"n_batch": 100000}, {"max_num_seqs": 4}),         # capped at the context
    ({"n_ctx": 16}, {"max_num_seqs": 4}),               # prompts over the context: refused
    ({"n_ctx": 17, "n_batch": 8}, {"max_num_seqs": 4}),
    ({"n_ctx": 64, "n_batch": 16}, {"max_num_seqs": 128}),
    ({"type_k": "q4_0", "type_v": "q4_0", "flash_attn": "off"}, {"max_num_seqs": 4}),  # V needs FA
    ({"type_k": "q4_0", "type_v": "f16", "flash_attn": "off"}, {"max_num_seqs": 4}),
    ({"type_k": "q8_0", "type_v": "f16", "flash_attn": "on"}, {"max_num_seqs": 4}),
    ({"kv_budget_mib": 1}, {"max_num_seqs": 4}),
    ({"embedding_tokens": 16}, {"max_num_seqs": 4}),
]


@pytest.mark.timeout(400)
def test_no_context_parameter_aborts_the_process():
    child = subprocess.run([sys.executable, str(CHILD), json.dumps(CASES)], capture_output=True, text=True,
                           timeout=380, stdin=subprocess.DEVNULL)
    started = [line.removeprefix("START ") for line in child.stdout.splitlines() if line.startswith("START ")]
    done = [line for line in child.stdout.splitlines() if line.startswith("DONE ")]
    if child.returncode < 0:
        asserts = [line for line in child.stderr.splitlines() if "GGML_ASSERT" in line]
        pytest.fail(f"llama.cpp killed the process with {signal.Signals(-child.returncode).name} in case "
                    f"{started[-1] if started else '?'}: {asserts[-1] if asserts else child.stderr[-600:]}")
    assert child.returncode == 0, child.stderr[-2000:]
    assert len(done) == len(CASES), child.stdout
