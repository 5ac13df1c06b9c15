"""OpenAI's stored chat completions: a chat completion sent with ``store: true`` is kept, and
``client.chat.completions.list / retrieve / update / delete`` and ``.messages.list`` read it.

Evaluation and distillation tools keep a model's answers this way and read them back by id,
model or metadata. Here they are kept in memory, the newest ``[server] stored_chat_completions``
of them (the oldest forgotten first; a restart forgets all, and a 404 says so); a completion is
kept whole or streamed, once every choice has finished (a request that failed keeps nothing).
"""

from __future__ import annotations

from typing import Any, Literal

import attrs
from fastapi import FastAPI, Request

from ruvllm.errors import InvalidRequest
from ruvllm.server.http.cursor_page import page
from ruvllm.server.http.strict_fields import RequestBody, refuse_unknown_query
from ruvllm.server.openai.newest_kept import NewestKept
from ruvllm.server.openai.schemas import ChatCompletionRequest, Metadata

#: OpenAI's limits on a page of completions or messages.
MAX_PAGE = 100


@attrs.define(kw_only=True)
class StoredChat:
    #: The ``chat.completion`` object, with the request's ``metadata``.
    completion: dict[str, Any]
    #: The request's messages, each with an id.
    messages: list[dict[str, Any]]

    @property
    def id(self) -> str:
        return self.completion["id"]


class ChatCompletionStore(NewestKept[StoredChat]):
    """The newest ``capacity`` stored chat completions by id (0: none are kept)."""

    def __init__(self, capacity: int):
        super().__init__(capacity, kind="chat completion", setting="stored_chat_completions",
                         advice="keep the answers you need on your side")

    def keep(self, body: ChatCompletionRequest, completion: dict[str, Any]) -> None:
        """Keep ``completion`` (the answer to ``body``, which asked to store it)."""
        messages = [{**m.model_dump(exclude_none=True), "id": f"{completion['id']}-{i}"}
                    for i, m in enumerate(body.messages)]
        self.put(completion["id"], StoredChat(completion={**completion, "metadata": body.metadata or {}},
                                              messages=messages))


class ChatCompletionUpdate(RequestBody):
    #: The completion's new metadata (null clears it).
    metadata: Metadata | None


def _metadata_filter(request: Request) -> dict[str, str]:
    """OpenAI's ``metadata[key]=value`` query parameters."""
    return {key[len("metadata["):-1]: value for key, value in request.query_params.items()
            if key.startswith("metadata[") and key.endswith("]")}


def register_chat_store_routes(app: FastAPI, store: ChatCompletionStore) -> None:
    @app.get("/v1/chat/completions")
    async def list_completions(request: Request, after: str | None = None, limit: int = 20,
                               order: Literal["asc", "desc"] = "asc",
                               model: str | None = None) -> dict[str, Any]:
        wanted = _metadata_filter(request)
        filters = {f"metadata[{key}]" for key in wanted}
        refuse_unknown_query([k for k in request.query_params if k not in filters],
                             ("after", "limit", "order", "model"), "GET /v1/chat/completions")
        kept = [s.completion for s in store.values()
                if (model is None or s.completion["model"] == model)
                and all(s.completion["metadata"].get(k) == v for k, v in wanted.items())]
        return page(kept, after, limit, max_limit=MAX_PAGE, order=order)

    @app.get("/v1/chat/completions/{completion_id}")
    async def retrieve(completion_id: str) -> dict[str, Any]:
        return store.get(completion_id).completion

    @app.post("/v1/chat/completions/{completion_id}")
    async def update(completion_id: str, body: ChatCompletionUpdate) -> dict[str, Any]:
        stored = store.get(completion_id)
        stored.completion = {**stored.completion, "metadata": body.metadata or {}}
        return stored.completion

    @app.delete("/v1/chat/completions/{completion_id}")
    async def delete(completion_id: str) -> dict[str, Any]:
        store.delete(completion_id)
        return {"object": "chat.completion.deleted", "id": completion_id, "deleted": True}

    @app.get("/v1/chat/completions/{completion_id}/messages")
    async def messages(completion_id: str, request: Request, after: str | None = None, limit: int = 20,
                       order: Literal["asc", "desc"] = "asc") -> dict[str, Any]:
        refuse_unknown_query(request.query_params.keys(), ("after", "limit", "order"),
                             "GET /v1/chat/completions/{id}/messages")
        return page(store.get(completion_id).messages, after, limit, max_limit=MAX_PAGE, order=order)


def refuse_storing_nowhere(body: ChatCompletionRequest, store: ChatCompletionStore) -> None:
    """A request that asks to be stored on a server that keeps none is refused by name."""
    if body.store and store.capacity == 0:
        raise InvalidRequest("store", "this server keeps no chat completions ([server] "
                             "stored_chat_completions = 0), so nothing could be fetched later; leave store "
                             "out or false")
