"""One ``answer()`` for every surface (lifecycle/answering.py, issue 62): the stream the client
asked for, or the whole answer once every choice finished, or a 499 and nothing else when the
client left first, every unfinished choice then cancelled. llama-server's whole answer, read from
its own stream of objects, goes through the same function (``read_whole``) as the others'.

No model and no HTTP: a choice that never finishes stands in for the engine, and the request
says when its client has left.
"""

from __future__ import annotations

import asyncio

import pytest
from fastapi.responses import JSONResponse
from ruvllm.server.http.sse import SSEResponse
from ruvllm.server.lifecycle.answering import CLIENT_GONE, answer
from ruvllm.server.lifecycle.completion_service import Submission, _Running


class _Endless:
    """An engine request that produces nothing until it is cancelled."""

    request_id = "r-0"

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def __aiter__(self) -> _Endless:
        return self

    async def __anext__(self):
        await asyncio.Event().wait()

    async def result(self):
        await asyncio.Event().wait()


class _Request:
    def __init__(self, *, gone: bool) -> None:
        self.gone = gone

    async def is_disconnected(self) -> bool:
        return self.gone


def _submission() -> tuple[Submission, _Endless]:
    handle = _Endless()
    return Submission("resp", [_Running(0, handle)]), handle  # type: ignore[arg-type]


async def _forever() -> JSONResponse:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


@pytest.mark.parametrize("kind", ["whole", "read_whole"])
def test_a_client_gone_before_the_answer_gets_499_and_the_choices_are_cancelled(kind):
    submission, handle = _submission()
    whole = {"whole": lambda outcomes: JSONResponse({"outcomes": len(outcomes)})} if kind == "whole" \
        else {"read_whole": _forever}
    response = asyncio.run(answer(submission, _Request(gone=True), streamed=None, **whole))  # type: ignore[arg-type]
    assert response.status_code == CLIENT_GONE == 499 and response.body == b""
    assert handle.cancelled


def test_the_whole_answer_a_surface_reads_itself_reaches_a_client_that_stayed():
    submission, handle = _submission()

    async def read() -> JSONResponse:
        return JSONResponse({"content": "hi"})

    response = asyncio.run(answer(submission, _Request(gone=False), streamed=None, read_whole=read))  # type: ignore[arg-type]
    assert response.status_code == 200 and response.body == b'{"content":"hi"}'
    assert handle.cancelled  # what had not finished is let go once the answer is made


def test_a_stream_is_the_surfaces_and_closing_it_cancels():
    submission, handle = _submission()

    async def events():
        yield "data: {}\n\n"

    response = asyncio.run(answer(submission, _Request(gone=False), streamed=events,  # type: ignore[arg-type]
                                  read_whole=_forever))
    assert type(response) is SSEResponse and not handle.cancelled
    response._on_close()  # what the response calls once its connection closes, finished or not
    assert handle.cancelled


def test_one_whole_answer_is_given_not_two_nor_none():
    submission, _ = _submission()
    for both_or_neither in ({}, {"whole": lambda o: JSONResponse({}), "read_whole": _forever}):
        with pytest.raises(TypeError):
            asyncio.run(answer(submission, _Request(gone=False), streamed=None,  # type: ignore[arg-type]
                               **both_or_neither))
