"""Scores and reranking (``/score``, ``/rerank`` and its aliases, llama-server's ``/reranking``,
TEI's ``texts``) through the real server (llamacpp, embedded SmolLM2), with Cohere's official
client where a client exists.

A score must be the cosine of the two texts' ``/v1/embeddings`` vectors (docs/server.md says
so), and a ranking must put the paraphrase above the other topic's sentences (the model
separates them by ~0.2 of cosine, ruvllm.testing.embeddings.TOPIC_MARGIN).
"""

from __future__ import annotations

import math

import cohere
import httpx
import numpy as np
import pytest
from ruvllm.testing.embeddings import MIN_BATCH_COSINE, TOPIC_TEXTS
from server_helpers import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CAT, KITTEN, MONEY, STOCKS = TOPIC_TEXTS
#: A text's vector batched with other texts may turn by up to acos(MIN_BATCH_COSINE) (the kernels
#: block the work differently per batch shape; llama.cpp's AVX2 kernels more than AVX-512's), so a
#: cosine between two vectors embedded in different batches may move by twice that (~0.028); the
#: scores compared here are ~0.2 apart, so a score of the wrong pair still fails.
ATOL = 2 * math.acos(MIN_BATCH_COSINE)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=AUTH, timeout=120)


def cosine(server, a: str, b: str) -> float:
    data = post(server, "/v1/embeddings", {"input": [a, b]}).json()["data"]
    return float(np.dot(data[0]["embedding"], data[1]["embedding"]))


def test_cohere_client_ranks_the_paraphrase_first(server, model_name):
    client = cohere.ClientV2(api_key=API_KEY, base_url=server.url, timeout=120)
    docs = [MONEY, CAT, STOCKS]
    answer = client.rerank(model=model_name, query=KITTEN, documents=docs)
    assert answer.results[0].index == 1
    scores = [r.relevance_score for r in answer.results]
    assert scores == sorted(scores, reverse=True) and len(scores) == 3
    for r in answer.results:
        assert r.relevance_score == pytest.approx(cosine(server, KITTEN, docs[r.index]), abs=ATOL)
    top = client.rerank(model=model_name, query=KITTEN, documents=docs, top_n=1)
    assert [(r.index, r.relevance_score) for r in top.results] == [(1, scores[0])]


def test_every_rerank_path_answers_the_same_ranking(server):
    body = {"query": "How did the markets do?", "documents": [CAT, STOCKS, {"text": KITTEN}, MONEY]}
    answers = {path: post(server, path, body).json()
               for path in ("/rerank", "/v1/rerank", "/v2/rerank", "/reranking", "/v1/reranking")}
    ranked = {path: [(r["index"], r["relevance_score"]) for r in a["results"]] for path, a in answers.items()}
    first = ranked["/rerank"]
    assert all(r == first for r in ranked.values()), ranked
    assert {i for i, _ in first[:2]} == {1, 3}  # the markets' sentences above the cats'
    a = answers["/reranking"]
    assert a["object"] == "list" and a["model"] and a["id"].startswith("rerank-")
    texts = [CAT, STOCKS, KITTEN, MONEY]
    assert [r["document"]["text"] for r in a["results"]] == [texts[i] for i, _ in first]
    counts = [len(post(server, "/tokenize", {"prompt": t}).json()["tokens"]) for t in [body["query"], *texts]]
    assert a["usage"] == {"prompt_tokens": sum(counts), "total_tokens": sum(counts)}


def test_rerank_options(server):
    docs = [MONEY, CAT, STOCKS]
    bare = post(server, "/rerank", {"query": KITTEN, "documents": docs, "return_documents": False,
                                    "top_n": 2}).json()["results"]
    assert len(bare) == 2 and all("document" not in r for r in bare) and bare[0]["index"] == 1
    every = post(server, "/rerank", {"query": KITTEN, "documents": docs, "top_n": 0}).json()["results"]
    assert len(every) == 3
    # TEI's body: ``texts``, answered as a bare list of {index, score[, text]}.
    tei = post(server, "/rerank", {"query": KITTEN, "texts": docs, "return_text": True, "raw_scores": True})
    assert tei.status_code == 200, tei.text
    assert [(r["index"], r["score"], r["text"]) for r in tei.json()] == \
        [(r["index"], r["relevance_score"], docs[r["index"]]) for r in every]


def test_max_tokens_per_doc_scores_the_head_of_a_long_document(server):
    long_doc = STOCKS + " " + "word " * 600  # beyond the llamacpp embedding context (512 tokens)
    r = post(server, "/v2/rerank", {"query": KITTEN, "documents": [long_doc]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "documents[0]", r.text
    head = post(server, "/tokenize", {"prompt": long_doc}).json()["tokens"][:12]
    cut = post(server, "/v2/rerank", {"query": KITTEN, "documents": [long_doc], "max_tokens_per_doc": 12})
    assert cut.status_code == 200, cut.text
    vectors = [post(server, "/v1/embeddings", {"input": x}).json()["data"][0]["embedding"]
               for x in (KITTEN, head)]
    assert cut.json()["results"][0]["relevance_score"] == pytest.approx(float(np.dot(*vectors)), abs=ATOL)
    assert cut.json()["usage"]["prompt_tokens"] == len(head) + len(
        post(server, "/tokenize", {"prompt": KITTEN}).json()["tokens"])


@pytest.mark.parametrize("names", [("text_1", "text_2"), ("queries", "documents"), ("queries", "items"),
                                   ("data_1", "data_2")])
def test_score_pairs_one_to_many_and_text_by_text(server, model_name, names):
    one, other = names
    fan = post(server, "/score", {one: KITTEN, other: [CAT, MONEY]})
    assert fan.status_code == 200, fan.text
    data = fan.json()
    assert data["object"] == "list" and data["model"] == model_name and data["id"].startswith("score-")
    assert [d["index"] for d in data["data"]] == [0, 1] and {d["object"] for d in data["data"]} == {"score"}
    assert data["data"][0]["score"] == pytest.approx(cosine(server, KITTEN, CAT), abs=ATOL)
    assert data["data"][1]["score"] == pytest.approx(cosine(server, KITTEN, MONEY), abs=ATOL)
    pairwise = post(server, "/v1/score", {one: [KITTEN, MONEY], other: [CAT, STOCKS]}).json()["data"]
    assert pairwise[0]["score"] == pytest.approx(data["data"][0]["score"], abs=ATOL)
    assert pairwise[1]["score"] == pytest.approx(cosine(server, MONEY, STOCKS), abs=ATOL)


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/score", {"text_1": [KITTEN, MONEY], "text_2": [CAT, STOCKS, MONEY]}, "text_2"),
    ("/score", {"text_1": KITTEN}, "text_2"),
    ("/score", {"documents": [CAT]}, "queries"),
    ("/score", {}, "text_1"),
    ("/score", {"queries": KITTEN, "documents": CAT, "items": MONEY}, "items"),
    ("/score", {"text_1": KITTEN, "text_2": []}, "text_2"),
    ("/score", {"text_1": [KITTEN, ""], "text_2": [CAT, MONEY]}, "text_1[1]"),
    ("/rerank", {"query": KITTEN}, "documents"),
    ("/rerank", {"query": KITTEN, "documents": [CAT], "texts": [CAT]}, "documents"),
    ("/rerank", {"query": KITTEN, "documents": [CAT, ""]}, "documents[1]"),
    ("/rerank", {"query": "", "documents": [CAT]}, "query"),
    ("/rerank", {"query": KITTEN, "documents": []}, "documents"),
    ("/rerank", {"query": KITTEN, "documents": [CAT], "top_n": -1}, "top_n"),
    ("/rerank", {"query": KITTEN, "documents": [CAT], "relevant_spans": {"max_spans": 2}}, "relevant_spans"),
    ("/rerank", {"query": KITTEN, "documents": [CAT], "rank_fields": ["title"]}, "rank_fields"),
    ("/reranking", {"query": KITTEN, "documents": [CAT], "model": "no-such-model"}, None),
])
def test_bad_bodies_are_refused_by_name(server, path, body, param):
    r = post(server, path, body)
    if param is None:
        assert r.status_code == 404, r.text
        return
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    assert post(server, "/rerank", {"query": KITTEN, "documents": [CAT]}).status_code == 200
