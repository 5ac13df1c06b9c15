"""Run by tests/llamacpp/test_context_limits.py in a child process: each option set at a limit of
llama.cpp's context parameters, through generate(), the serving engine (chunked prefill beside
decodes) and embeddings. Prints START/DONE per case, so that a native abort names its case."""

from __future__ import annotations

import itertools
import json
import sys

from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.errors import RuvllmError
from ruvllm.models import ModelSource
from ruvllm.registry import embedded_model_path
from ruvllm.types import GenerationParams
from ruvllm_llamacpp.backend import LlamaCppBackend


def run(options: dict, engine: dict) -> str:
    backend = LlamaCppBackend.load(ModelSource.from_path(embedded_model_path()), {"n_threads": 1, **options})
    with backend:
        short = backend.tokenizer.encode("Hello, my name is")
        long = backend.tokenizer.encode("The history of the city goes back many centuries. " * 4)
        params = GenerationParams(max_tokens=3)
        list(itertools.islice(backend.generate(short, params), 3))  # core stops a backend's stream
        with ServingEngine(backend, EngineOptions(**engine), owns_backend=False) as eng:
            handles = [eng.submit_sync(p, params) for p in (short, long, short, long)]
            for handle in handles:
                handle.result()
        try:
            backend.embed_batch([short, long])
        except RuvllmError as exc:  # a typed refusal (input over embedding_tokens) is a fine answer
            return f"embeddings refused: {exc}"
    return "ok"


if __name__ == "__main__":
    for options, engine in json.loads(sys.argv[1]):
        print("START", json.dumps([options, engine]), flush=True)
        try:
            outcome = run(options, engine)
        except RuvllmError as exc:
            outcome = f"refused: {type(exc).__name__}: {exc}"
        print("DONE", outcome, flush=True)
