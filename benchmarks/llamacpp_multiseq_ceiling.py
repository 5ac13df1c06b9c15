"""The ceiling for the llamacpp executor: llama.cpp's multi-sequence batch, driven directly.

No ruvllm code: llama-cpp-python's low-level API only. For C concurrent sequences, one context
with ``n_seq_max = C`` (split KV streams, as the executor uses), all C prompts prefilled in one
``llama_batch``, then one batch per step holding one token of every sequence, greedy argmax in
NumPy, a fixed number of tokens per sequence (EOS ignored, as the engine benchmark does).

    python benchmarks/llamacpp_multiseq_ceiling.py --model PATH.gguf --concurrency 1 4 16 32

``benchmarks/serving.py --compare-ceiling`` imports :func:`run_ceiling` to put both side by side
in one process (ratios from one run, as DESIGN-NOTES asks).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from pathlib import Path

import numpy as np
from ruvllm.bench.machine import machine_info, machine_line

PROMPTS_FILE = Path(__file__).with_name("serving_prompts.json")


def load_prompts(concurrency: int) -> list[str]:
    prompts = json.loads(PROMPTS_FILE.read_text())
    return [prompts[i % len(prompts)] for i in range(concurrency)]


class Model:
    """A loaded GGUF model (llama-cpp-python low-level handles)."""

    def __init__(self, path: str, n_threads: int):
        import llama_cpp

        self.lib = llama_cpp
        # llama-cpp-python routes llama.cpp's log through this logger: errors only.
        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            raise SystemExit(f"could not load {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_threads = n_threads

    def tokenize(self, text: str) -> list[int]:
        raw = text.encode()
        buf = (self.lib.llama_token * (len(raw) + 8))()
        n = self.lib.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), True, False)
        return list(buf[:n])

    def close(self) -> None:
        self.lib.llama_model_free(self.model)


def run_ceiling(model: Model, prompts: list[str], max_tokens: int, n_ctx_seq: int = 512,
                flash_attn: bool = False) -> dict:
    """Generate ``max_tokens`` greedy tokens for every prompt at once; returns timings.

    Flash attention is off by default, as in llama-cpp-python's ``Llama`` and ruvllm's
    llamacpp backend: llama.cpp's "auto" turns it on for CPU, which changes the numerics (a
    few near-tie tokens differ) as well as the speed, so both sides must use the same setting.
    """
    lib = model.lib
    c = len(prompts)
    tokens = [model.tokenize(p) for p in prompts]
    n_batch = max(sum(len(t) for t in tokens), c, 512)
    cp = lib.llama_context_default_params()
    cp.n_ctx = n_ctx_seq * c
    cp.n_batch = n_batch
    cp.n_ubatch = n_batch
    cp.n_seq_max = c
    cp.kv_unified = False
    cp.n_threads = cp.n_threads_batch = model.n_threads
    cp.no_perf = True
    cp.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                          else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    ctx = lib.llama_init_from_model(model.model, cp)
    batch = lib.llama_batch_init(n_batch, 0, 1)
    try:
        start = time.perf_counter()
        # Prefill: every prompt in one batch, logits at each prompt's last token.
        n = 0
        for s, toks in enumerate(tokens):
            for i, t in enumerate(toks):
                batch.token[n] = t
                batch.pos[n] = i
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = s
                batch.logits[n] = i == len(toks) - 1
                n += 1
        batch.n_tokens = n
        if lib.llama_decode(ctx, batch) != 0:
            raise SystemExit("prefill failed")
        logits = np.ctypeslib.as_array(lib.llama_get_logits(ctx), shape=(c, model.n_vocab))
        nxt = logits.argmax(axis=1)
        first = time.perf_counter()
        outputs = [[int(t)] for t in nxt]
        pos = [len(t) for t in tokens]
        for s in range(c):
            batch.n_seq_id[s] = 1
            batch.seq_id[s][0] = s
            batch.logits[s] = 1
        for _ in range(max_tokens - 1):
            for s in range(c):
                batch.token[s] = outputs[s][-1]
                batch.pos[s] = pos[s]
                pos[s] += 1
            batch.n_tokens = c
            if lib.llama_decode(ctx, batch) != 0:
                raise SystemExit("decode failed")
            logits = np.ctypeslib.as_array(lib.llama_get_logits(ctx), shape=(c, model.n_vocab))
            for s, t in enumerate(logits.argmax(axis=1)):
                outputs[s].append(int(t))
        end = time.perf_counter()
    finally:
        lib.llama_batch_free(batch)
        lib.llama_free(ctx)
    total = end - start
    return {
        "concurrency": c,
        "output_tokens": c * max_tokens,
        "seconds": total,
        "output_tok_s": c * max_tokens / total,
        "ttft_p50": first - start,
        "ttft_p95": first - start,
        "tpot": (end - first) / max(max_tokens - 1, 1),
        "outputs": outputs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="GGUF file")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--n-ctx", type=int, default=512, help="KV cells per sequence")
    ap.add_argument("--flash-attn", action="store_true", help="llama.cpp flash attention on (default off)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()
    import llama_cpp

    model = Model(args.model, args.threads)
    rows = []
    for c in args.concurrency:
        runs = [run_ceiling(model, load_prompts(c), args.max_tokens, args.n_ctx, flash_attn=args.flash_attn)
                for _ in range(args.repeats)]
        med = {k: statistics.median(r[k] for r in runs) for k in ("output_tok_s", "ttft_p50", "tpot")}
        rows.append({"concurrency": c, **med})
    model.close()
    print(machine_line())
    print(f"llama-cpp-python {llama_cpp.__version__} low-level multi-sequence; "
          f"model {Path(args.model).name}; {args.max_tokens} tokens/request; median of {args.repeats}")
    print(f"{'C':>4} {'out tok/s':>10} {'TTFT p50':>9} {'TPOT ms':>8}")
    for r in rows:
        print(f"{r['concurrency']:>4} {r['output_tok_s']:>10.1f} {r['ttft_p50']:>8.3f}s "
              f"{r['tpot'] * 1e3:>8.1f}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
