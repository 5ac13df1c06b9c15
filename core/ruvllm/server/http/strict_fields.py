"""Refusing request fields the server does not know, by name, at parse time.

OpenAI's own server ignores unknown fields; for ruvllm that would be silent misbehaviour: a
client sending vLLM's ``allowed_token_ids`` or a misspelt ``temprature`` would get an answer made
without it and never know. The accepted names are the model's declared fields (and their
aliases), so fields other modules add to a request model are accepted with no list to update.
Every surface's request bodies derive from :class:`RequestBody`, the objects inside them from
:class:`StrictModel`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from ruvllm.errors import InvalidRequest


def accepted_fields(model: type[BaseModel]) -> set[str]:
    names = set()
    for name, field in model.model_fields.items():
        names.add(name)
        if field.alias:
            names.add(field.alias)
    return names


def refuse_unknown_fields(model: type[BaseModel], data: Any) -> Any:
    """``data`` unchanged, or :class:`InvalidRequest` naming every field ``model`` lacks."""
    if isinstance(data, dict):
        unknown = sorted(k for k in data if k not in accepted_fields(model))
        if unknown:
            names = ", ".join(unknown)
            them = "them" if len(unknown) > 1 else "it"
            raise InvalidRequest(
                unknown[0], f"unknown field{'s' if len(unknown) > 1 else ''} {names}: ruvllm does not "
                f"accept {them}; remove {them} (the accepted fields are listed in docs/server.md and in "
                "/openapi.json)")
    return data


class StrictModel(BaseModel):
    """An object inside a request body: a field it does not declare is a 400 naming it with its
    path (``messages[0].nmae``, pydantic's ``extra_forbidden`` mapped by ruvllm.server.http.errors)."""

    model_config = ConfigDict(extra="forbid")


class RequestBody(StrictModel):
    """A request body: the fields it does not declare are all named in one 400."""

    @model_validator(mode="before")
    @classmethod
    def _known_fields_only(cls, data: Any) -> Any:
        return refuse_unknown_fields(cls, data)


def type_tag(value: Any, default: str | None = None) -> str:
    """The tag (``type=text``) that picks a member of a union tagged by its ``type`` field, read
    from a body's dict or a parsed model alike. Anything else a client sends where such an object
    belongs (a list, a number, a ``type`` that is an object) gets a tag no member has, so that it is
    a 400 naming the field rather than an error inside the discriminator."""
    kind = value.get("type", default) if isinstance(value, dict) else getattr(value, "type", default)
    return f"type={kind}"


def refuse_unknown_query(names: Iterable[str], accepted: Iterable[str], route: str) -> None:
    """:class:`InvalidRequest` naming every query parameter of ``route`` other than ``accepted``
    (``?modle=x`` must not quietly answer as if it were not sent), as unknown body fields are."""
    known = set(accepted)
    unknown = sorted(set(names) - known)
    if unknown:
        them = "them" if len(unknown) > 1 else "it"
        takes = f"takes only {', '.join(sorted(known))}" if known else "takes no query parameters"
        raise InvalidRequest(unknown[0], f"unknown query parameter{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(unknown)}: {route} {takes}; remove {them}")
