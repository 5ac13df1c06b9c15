"""mistral.rs computes with as many threads as the process has CPUs, not as the machine has.

The regression: pinned to one CPU (a pinned test worker, ``taskset``, a container's cpuset),
mistral.rs kept a second compute thread (candle's ``candle-bp-0``) that its caller spin-waits
for on the same CPU: one stream of the embedded model ran at 1.2 tok/s instead of 8.7, and the
conformance suite on mistralrs overran its time limit inside ``make test``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from ruvllm_mistralrs.threads import choose_threads

PINNED_LOAD = textwrap.dedent("""
    import json, os
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    for name in ("CANDLE_NUM_THREADS", "RAYON_NUM_THREADS"):
        os.environ.pop(name, None)
    from ruvllm.registry import embedded_model_path
    from ruvllm.models import ModelSource
    from ruvllm.types import GenerationParams
    from ruvllm_mistralrs import MistralRsBackend

    backend = MistralRsBackend.load(ModelSource.from_path(embedded_model_path()), {"max_seqs": 2})
    tokens = list(backend.generate(backend.tokenizer.encode("Hello"), GenerationParams(max_tokens=3)))
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    print(json.dumps({"tokens": len(tokens), "notes": list(backend.capabilities().notes),
                      "compute_workers": sorted(n for n in names if n.startswith("candle-bp"))}))
    backend.close()
""")


def test_the_option_wins_then_an_exported_variable_then_the_usable_cpus():
    assert choose_threads(3, {"RAYON_NUM_THREADS": "8"}, 2) == (3, "backend option threads")
    both = {"CANDLE_NUM_THREADS": "4", "RAYON_NUM_THREADS": "8"}
    assert choose_threads(None, both, 2) == (4, "CANDLE_NUM_THREADS from the environment")
    rayon = {"RAYON_NUM_THREADS": "8"}
    assert choose_threads(None, rayon, 2) == (8, "RAYON_NUM_THREADS from the environment")
    for junk in ("", "0", "all", "-1"):
        assert choose_threads(None, {"RAYON_NUM_THREADS": junk}, 2) == (2, "the CPUs this process may run on")


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_a_process_pinned_to_one_cpu_gets_one_compute_thread():
    out = subprocess.run([sys.executable, "-c", PINNED_LOAD], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["tokens"] == 3
    assert "1 CPU compute threads (the CPUs this process may run on)" in seen["notes"]
    assert seen["compute_workers"] == [], "a compute thread waits spinning for a CPU it shares"
