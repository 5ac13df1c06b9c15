"""Fixtures for the mlx backend tests: the embedded SmolLM2 GGUF, loaded once per session.

MLX on this CPU is slow (see docs/backends/mlx.md), so tests generate a few tokens only and
share one loaded backend.
"""

from __future__ import annotations

import pytest

# Through ruvllm_mlx.mlx_core: MLX's CPU BLAS is set up before MLX is imported (see cpu_blas.py).
pytest.importorskip("ruvllm_mlx", reason="the ruvllm-mlx plugin is not installed")
pytest.importorskip("ruvllm_mlx.mlx_core", reason="MLX is not installed (pip install 'mlx[cpu]')")

from ruvllm.models import ModelSource
from ruvllm.registry import embedded_model_path

#: Chat prompts of the llama.cpp parity proof (and reused where a real prompt is needed).
QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers.",
    "What is 12 times 7?",
    "Give me a tip for learning Python.",
    "Who wrote Romeo and Juliet?",
    "Describe a cat in five words.",
)


@pytest.fixture(scope="session")
def model_path():
    return embedded_model_path()


@pytest.fixture(scope="session")
def backend(model_path):
    from ruvllm_mlx.backend import MlxBackend

    b = MlxBackend.load(ModelSource.from_path(model_path), {"context_length": 2048})
    yield b
    b.close()


@pytest.fixture(scope="session")
def chat_ids(backend):
    """Token ids of each question rendered with the model's chat template."""
    import jinja2

    template = jinja2.Template(backend.info.chat_template)

    def render(question: str) -> list[int]:
        text = template.render(messages=[{"role": "user", "content": question}], add_generation_prompt=True)
        return backend.tokenizer.encode(text, parse_special=True)

    return [render(q) for q in QUESTIONS]
