"""Every failure leaves the server in its API's error shape with the status from ruvllm.errors.

``{"error": {"message", "type", "param", "code"}}`` is what OpenAI clients parse; the status
code is what they branch on (the ``openai`` package raises ``BadRequestError`` for 400,
``AuthenticationError`` for 401...). Anthropic's Messages API (``/v1/messages...``) answers in
Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``, which the ``anthropic``
package reads, and Ollama's API (``/api/...``) in Ollama's, ``{"error": "..."}``
(:func:`surface_body`). Nothing answers an error with 200.
"""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ruvllm.errors import ContextLengthExceeded, InvalidRequest, Overloaded, RuvllmError

log = logging.getLogger(__name__)

_STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded",
}


_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
#: Paths whose errors take Anthropic's shape.
ANTHROPIC_PREFIX = "/v1/messages"
#: Paths whose errors take Ollama's shape, ``{"error": "<message>"}`` (what its clients raise).
OLLAMA_PREFIX = "/api/"


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}


def surface_body(path: str, status: int, body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-shaped error ``body`` in the shape of the API that ``path`` belongs to; those
    shapes have no ``param``, so their message starts with the field's path."""
    if not path.startswith((ANTHROPIC_PREFIX, OLLAMA_PREFIX)):
        return body
    error = body["error"]
    param = error.get("param")
    message = error["message"]
    message = message if not param or message.startswith(param) else f"{param}: {message}"
    if path.startswith(OLLAMA_PREFIX):
        return {"error": message}
    return anthropic_error_body(status, message)


def error_body(message: str, type_: str, *, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, type_: str | None = None, *, param: str | None = None,
                   code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    body = error_body(message, type_ or _STATUS_TYPES.get(status, "server_error"), param=param, code=code)
    return JSONResponse(body, status_code=status, headers=headers)


def ruvllm_error_body(exc: RuvllmError) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, body, headers) for a ruvllm error."""
    param = exc.field if isinstance(exc, InvalidRequest) else None
    code = "context_length_exceeded" if isinstance(exc, ContextLengthExceeded) else exc.error_type
    headers = {}
    if isinstance(exc, Overloaded):
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    return exc.http_status, error_body(str(exc), exc.error_type, param=param, code=code), headers


#: pydantic's names for the branches of a union, which are not fields.
_BRANCH_LABEL = re.compile(r"^(constrained-)?(str|int|float|bool|bytes)$")


def _validation_field(err: dict[str, Any]) -> str:
    # The field's own path: not where it came from (a body, a query string).
    loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query")]
    # Drop pydantic's union branch labels ("str", "list[int]", "constrained-int", a tagged union's
    # "type=text") so the field reads as the API's.
    parts = [p for p in loc if not any(ch in p for ch in "[]=") and not _BRANCH_LABEL.match(p)]
    field = ""
    for p in parts:
        field += f"[{p}]" if p.isdigit() else (f".{p}" if field else p)
    return field or "body"


#: What a JSON value other than an object is called, for a message about one.
_JSON_KINDS = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number",
               type(None): "null"}
#: The tags of a union tagged by its members' ``type`` (``'type=text'``: the member whose type is text).
_TYPE_TAG = re.compile(r"'type=([^']*)'")


def _tagged_union(field: str, err: dict[str, Any]) -> tuple[str, str] | None:
    """``(field, message)`` for a value no member of a union tagged by ``type`` takes: the
    ``type`` named with the types it may have, rather than pydantic's "Input tag 'type={}' found
    using type_tag()", which speaks of the server's code, not of the client's body."""
    kinds = _TYPE_TAG.findall(str((err.get("ctx") or {}).get("expected_tags", "")))
    if err.get("type") != "union_tag_invalid" or not kinds:
        return None
    allowed = ", ".join(kinds)
    value = err.get("input")
    if not isinstance(value, dict):
        return field, f"must be an object whose type is one of {allowed}; got {_JSON_KINDS[type(value)]}"
    if "type" not in value:
        return f"{field}.type", f"is required: one of {allowed}"
    return f"{field}.type", f"must be one of {allowed}; got {json.dumps(value['type'])}"


def _shaped(request: Request, response: JSONResponse) -> JSONResponse:
    if not request.url.path.startswith((ANTHROPIC_PREFIX, OLLAMA_PREFIX)):
        return response
    body = surface_body(request.url.path, response.status_code, json.loads(response.body))
    headers = {k: v for k, v in response.headers.items()
               if k.lower() not in ("content-length", "content-type")}
    return JSONResponse(body, status_code=response.status_code, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RuvllmError)
    async def _ruvllm(request: Request, exc: RuvllmError) -> JSONResponse:
        status, body, headers = ruvllm_error_body(exc)
        if status >= 500:
            log.error("request failed: %s", exc)
        return _shaped(request, JSONResponse(body, status_code=status, headers=headers))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        # A value that matches no branch of a union (``str | list[Block]``) fails every branch:
        # the deepest error is the one that names what is wrong (a block's unknown field, its
        # unknown type), not "Input should be a valid string".
        first = max(errors, key=lambda e: (e.get("type") == "extra_forbidden", len(e.get("loc", ()))),
                    default={"loc": (), "msg": "invalid request body"})
        field = _validation_field(first)
        msg = first.get("msg", "invalid value")
        field, msg = _tagged_union(field, first) or (field, msg)
        if first.get("type") == "json_invalid":
            return _shaped(request, error_response(400, f"the request body is not valid JSON: {msg}",
                                                   param="body", code="invalid_json"))
        return _shaped(request, error_response(400, f"{field}: {msg}", param=field, code="invalid_value"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _shaped(request, error_response(exc.status_code, str(exc.detail),
                                               headers=getattr(exc, "headers", None)))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error serving %s", request.url.path)
        return _shaped(request, error_response(500, f"internal error: {type(exc).__name__}: {exc}",
                                               "server_error"))
