"""Refusing request fields the server does not know, by name, at parse time.

OpenAI's own server ignores unknown fields; for ruvllm that would be silent misbehaviour: a
client sending vLLM's ``allowed_token_ids`` or a misspelt ``temprature`` would get an answer made
without it and never know. The accepted names are the model's declared fields (and their
aliases), so fields other modules add to a request model are accepted with no list to update.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

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
