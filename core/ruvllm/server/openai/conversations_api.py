"""OpenAI's Conversations API (``/v1/conversations``) and the Responses API's ``conversation``.

A conversation is a list of items kept by the server: a client creates it (with first items),
adds items, lists or deletes them, and a response created with ``conversation`` starts from its
items and, once answered, appends its own input and output to it, as OpenAI's does. The items
are the Responses API's (messages, function calls and their outputs, reasoning), checked as
``input`` is. Kept in memory, the newest ``[server] stored_conversations`` of them; the oldest
is forgotten first, and a restart forgets all (a 404 says so).
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

import attrs
from fastapi import FastAPI, Request
from pydantic import Field, model_validator

from ruvllm.errors import InvalidRequest, StoredObjectNotFound
from ruvllm.server.http.cursor_page import page
from ruvllm.server.http.strict_fields import RequestBody, refuse_unknown_query
from ruvllm.server.openai.newest_kept import NewestKept
from ruvllm.server.openai.response_store import dumped, with_ids
from ruvllm.server.openai.responses_schema import Item, refuse_unserved_items
from ruvllm.server.openai.schemas import Metadata

#: OpenAI's limit on the items one create or add call carries.
MAX_ITEMS_PER_CALL = 20


class _ItemsBody(RequestBody):
    @model_validator(mode="before")
    @classmethod
    def _served_kinds_only(cls, data: Any) -> Any:
        if isinstance(data, dict):
            refuse_unserved_items(data.get("items"), "items")
        return data


class ConversationCreate(_ItemsBody):
    items: Annotated[list[Item], Field(max_length=MAX_ITEMS_PER_CALL)] | None = None
    metadata: Metadata | None = None


class ConversationUpdate(RequestBody):
    metadata: Metadata | None


class ItemsCreate(_ItemsBody):
    items: Annotated[list[Item], Field(min_length=1, max_length=MAX_ITEMS_PER_CALL)]


def item_dicts(items: list[Any]) -> list[dict[str, Any]]:
    """Parsed items as the dicts a conversation keeps (each with an id)."""
    return with_ids(dumped(items))


@attrs.define(kw_only=True)
class Conversation:
    id: str
    created_at: int
    metadata: dict[str, str]
    items: list[dict[str, Any]] = attrs.field(factory=list)

    def card(self) -> dict[str, Any]:
        """OpenAI's ``conversation`` object."""
        return {"id": self.id, "object": "conversation", "created_at": self.created_at,
                "metadata": self.metadata}

    def item(self, item_id: str) -> dict[str, Any]:
        found = next((i for i in self.items if i["id"] == item_id), None)
        if found is None:
            raise StoredObjectNotFound("item", item_id,
                                       f"GET /v1/conversations/{self.id}/items lists its items")
        return found


class ConversationStore(NewestKept[Conversation]):
    """The newest ``capacity`` conversations by id (0: none are kept)."""

    def __init__(self, capacity: int):
        super().__init__(capacity, kind="conversation", setting="stored_conversations",
                         advice="send the items in each request's input")

    def create(self, items: list[dict[str, Any]], metadata: dict[str, str] | None) -> Conversation:
        if self.capacity == 0:
            raise InvalidRequest("conversation", "this server keeps no conversations ([server] "
                                 "stored_conversations = 0); send the items in each request's input")
        conversation = Conversation(id=f"conv_{uuid.uuid4().hex}", created_at=int(time.time()),
                                    metadata=metadata or {}, items=items)
        self.put(conversation.id, conversation)
        return conversation

    def item(self, item_id: str) -> dict[str, Any] | None:
        """The item with this id in a kept conversation (the newest holding it)."""
        for conversation in reversed(self.values()):
            found = next((i for i in conversation.items if i["id"] == item_id), None)
            if found is not None:
                return found
        return None


def conversation_id(value: str | dict[str, Any]) -> str:
    """The id a Responses request's ``conversation`` names (the id, or ``{"id": ...}``)."""
    if isinstance(value, str):
        return value
    if set(value) != {"id"} or not isinstance(value["id"], str):
        raise InvalidRequest("conversation", "is a conversation id, or {\"id\": <id>}", value)
    return value["id"]


def register_conversation_routes(app: FastAPI, store: ConversationStore) -> None:
    @app.post("/v1/conversations")
    async def create(body: ConversationCreate) -> dict[str, Any]:
        return store.create(item_dicts(body.items or []), body.metadata).card()

    @app.get("/v1/conversations/{conversation_id}")
    async def retrieve(conversation_id: str) -> dict[str, Any]:
        return store.get(conversation_id).card()

    @app.post("/v1/conversations/{conversation_id}")
    async def update(conversation_id: str, body: ConversationUpdate) -> dict[str, Any]:
        conversation = store.get(conversation_id)
        conversation.metadata = body.metadata or {}
        return conversation.card()

    @app.delete("/v1/conversations/{conversation_id}")
    async def delete(conversation_id: str) -> dict[str, Any]:
        store.delete(conversation_id)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    @app.post("/v1/conversations/{conversation_id}/items")
    async def add_items(conversation_id: str, body: ItemsCreate) -> dict[str, Any]:
        conversation = store.get(conversation_id)
        added = item_dicts(body.items)
        conversation.items.extend(added)
        return page(added, None, len(added))

    @app.get("/v1/conversations/{conversation_id}/items")
    async def list_items(conversation_id: str, request: Request, limit: int = 20,
                         order: Literal["asc", "desc"] = "desc", after: str | None = None) -> dict[str, Any]:
        refuse_unknown_query(request.query_params.keys(), ("limit", "order", "after"),
                             "GET /v1/conversations/{id}/items")
        items = store.get(conversation_id).items
        return page(items, after, limit, max_limit=100, order=order)

    @app.get("/v1/conversations/{conversation_id}/items/{item_id}")
    async def get_item(conversation_id: str, item_id: str) -> dict[str, Any]:
        return store.get(conversation_id).item(item_id)

    @app.delete("/v1/conversations/{conversation_id}/items/{item_id}")
    async def delete_item(conversation_id: str, item_id: str) -> dict[str, Any]:
        conversation = store.get(conversation_id)
        conversation.items.remove(conversation.item(item_id))
        return conversation.card()
