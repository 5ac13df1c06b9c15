"""mistral.rs in-situ quantization (ISQ): memory and quality against the unquantized model.

For each ISQ type, a fresh process loads the Hugging Face directory of the embedded model (made
by ``ruvllm convert``) with ``isq=TYPE`` and reports: resident memory before and after loading,
load time, 16 greedy tokens for a fixed prompt (and how many match the unquantized ones), and
the perplexity of a fixed text (teacher-forced, see ``ruvllm_mistralrs.evaluation``).

    .venv/bin/python benchmarks/mistralrs_isq.py --hf-dir /tmp/smollm2-hf --types none Q8_0 Q4K

Every figure is measured; a type the build cannot run is reported with mistral.rs's error.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

PROMPT = "The capital of France is"
TEXT = ("The sun rises in the east and sets in the west. Every morning, people wake up, eat "
        "breakfast and go to work.")
DEFAULT_TYPES = ["none", "Q8_0", "Q4_0", "Q4_1", "Q4K", "Q8K", "HQQ8", "HQQ4"]


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def measure_one(hf_dir: str, isq: str, threads: int | None) -> dict:
    import mistralrs  # noqa: F401  (imported before measuring so its code is not counted)
    from ruvllm.models import ModelSource
    from ruvllm.types import GenerationParams
    from ruvllm_mistralrs import MistralRsBackend
    from ruvllm_mistralrs.evaluation import forced_logprobs, perplexity

    options: dict = {"max_seqs": 1, "isq": isq}
    if threads:
        options["threads"] = threads
    before = rss_mib()
    t0 = time.perf_counter()
    backend = MistralRsBackend.load(ModelSource.from_path(hf_dir), options)
    load_s = time.perf_counter() - t0
    after = rss_mib()
    try:
        tok = backend.tokenizer
        ids = tok.encode(PROMPT)
        stream = backend.generate(ids, GenerationParams(max_tokens=16, ignore_eos=True))
        out = [t.token_id for t in _take(stream, 16)]
        text_ids = tok.encode(TEXT)
        ppl = perplexity(forced_logprobs(backend, text_ids[:1], text_ids[1:]))
    finally:
        backend.close()
    return {"isq": isq, "rss_before_mib": before, "rss_after_mib": after, "load_s": load_s,
            "tokens": out, "text": tok.decode(out), "perplexity": ppl}


def _take(it, n):
    out = []
    for x in it:
        out.append(x)
        if len(out) >= n:
            break
    it.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf-dir", required=True, help="Hugging Face directory (ruvllm convert output)")
    ap.add_argument("--types", nargs="+", default=DEFAULT_TYPES)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.hf_dir, args.one, args.threads)))
        return
    from ruvllm.bench.machine import machine_line  # here: the --one child stays lean

    print(machine_line())
    print(f"model: {args.hf_dir}; prompt {PROMPT!r}; perplexity text of {len(TEXT)} chars")
    base = None
    print(f"{'isq':6} {'RSS before':>10} {'after':>8} {'delta MiB':>9} {'load s':>7} {'ppl':>8} "
          f"{'greedy match':>12}  text")
    for isq in args.types:
        cmd = [sys.executable, __file__, "--hf-dir", args.hf_dir, "--one", isq]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            err = [ln for ln in proc.stderr.splitlines() if "Error" in ln or "error" in ln][-1:]
            print(f"{isq:6} failed: {err[0] if err else proc.stderr[-300:]}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        if base is None:
            base = r
        same = 0  # leading greedy tokens equal to the first (unquantized) row
        for a, b in zip(r["tokens"], base["tokens"], strict=False):
            if a != b:
                break
            same += 1
        delta = r["rss_after_mib"] - r["rss_before_mib"]
        print(f"{isq:6} {r['rss_before_mib']:10.0f} {r['rss_after_mib']:8.0f} {delta:9.0f} "
              f"{r['load_s']:7.1f} {r['perplexity']:8.3f} {same:>6}/{len(base['tokens'])}  {r['text']!r}")


if __name__ == "__main__":
    main()
