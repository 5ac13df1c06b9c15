"""Embeddings on the ServingEngine's model thread (engine logic, on the fake model): a large
request runs in chunks of at most ``max_batch_tokens`` tokens with generation steps between
them, so a RAG indexer embedding thousands of documents does not freeze the streams running
beside it (a 768-document request held a llama.cpp stream for 44 s before, 1.9 s at most after)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence

import numpy as np
import pytest
from engine_fakes import FakeBackend, PagedFakeExecutor
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.errors import InvalidRequest
from ruvllm.types import Capabilities, GenerationParams

BUDGET = 16


class EmbeddingFake(FakeBackend):
    """The fake model with embeddings: a vector per input that depends on that input alone, and a
    log of the model thread's work (``embed`` calls with their token counts, executor ``step``s)."""

    def __init__(self, log: list[tuple[str, int]]):
        executor = PagedFakeExecutor(num_blocks=64, block_size=4)
        run = executor.execute

        def logged(batch):
            log.append(("step", len(batch)))
            time.sleep(0.002)  # a model's step takes time: the stream outlasts the embeddings
            return run(batch)

        executor.execute = logged  # type: ignore[method-assign]
        super().__init__(executor)
        self.log = log

    def capabilities(self) -> Capabilities:  # type: ignore[override]
        return Capabilities(executor=True, embeddings=True)

    def max_embedding_tokens(self) -> int:
        return 64

    def embed_batch(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        self.log.append(("embed", sum(len(ids) for ids in inputs)))
        return np.array([[sum(ids), len(ids), ids[0]] for ids in inputs], dtype=np.float32)


def test_a_large_request_is_embedded_in_chunks_between_generation_steps():
    log: list[tuple[str, int]] = []
    inputs = [[i % 30 + 1] * (i % 7 + 1) for i in range(60)]
    total = sum(map(len, inputs))  # 234 tokens

    async def main() -> np.ndarray:
        engine = ServingEngine(EmbeddingFake(log), EngineOptions(block_size=4, max_batch_tokens=BUDGET))
        try:
            handle = await engine.submit([1, 2, 3], GenerationParams(max_tokens=200, ignore_eos=True))
            await anext(aiter(handle))  # generating
            vectors = await engine.embed_async(inputs)
            handle.cancel()
            return vectors
        finally:
            await engine.shutdown()

    vectors = asyncio.run(main())
    np.testing.assert_array_equal(vectors, [[sum(x), len(x), x[0]] for x in inputs])
    embeds = [i for i, (kind, _) in enumerate(log) if kind == "embed"]
    assert all(log[i][1] <= BUDGET for i in embeds) and sum(log[i][1] for i in embeds) == total
    assert len(embeds) >= total // BUDGET
    # A step between every two chunks, however fast the event loop posts the next one.
    assert all(("step", 1) in log[a:b] for a, b in itertools.pairwise(embeds)), log


def test_an_input_longer_than_the_budget_is_a_chunk_of_its_own_and_a_bad_one_refuses_all():
    log: list[tuple[str, int]] = []
    engine = ServingEngine(EmbeddingFake(log), EngineOptions(block_size=4, max_batch_tokens=BUDGET))
    try:
        vectors = engine.embed([[5] * 3, [6] * 40, [7] * 2])
        assert [n for kind, n in log if kind == "embed"] == [3, 40, 2]
        np.testing.assert_array_equal(vectors[:, 1], [3, 40, 2])
        log.clear()
        with pytest.raises(InvalidRequest) as refused:
            engine.embed([[5] * 3] * 20 + [[6] * 65])
        assert refused.value.field == "input[20]" and not log  # nothing ran
    finally:
        engine.close()
