"""Ollama's own API on the same engine: ``/api/chat``, ``/api/generate``, ``/api/tags``,
``/api/show``, ``/api/ps``, ``/api/embed``, ``/api/embeddings``, ``/api/version`` and ``/api/pull``
of a served model; the routes that change Ollama's model store are refused by name.

A thin surface, as :mod:`ruvllm.server.anthropic.messages_api` is. A chat body is checked in Ollama's
terms (:mod:`ruvllm.server.ollama.ollama_schemas`) and translated into the chat request every surface
runs, the lifecycle's neutral :class:`~ruvllm.server.lifecycle.request_input.ChatInput`
(:mod:`ruvllm.server.lifecycle.chat_run`: the model's template, tools taught where it renders none,
limits, grammar, the one sampler). ``/api/generate`` is a completion on token ids: the prompt in
the chat template (or as is with ``raw``) after the token ``context`` of an earlier answer, run
through the same :class:`~ruvllm.server.lifecycle.completion_service.CompletionService` as
``/v1/completions``. Answers are Ollama's objects, streamed as newline-delimited JSON by default
(Ollama's ``stream`` defaults to true), the last one ``done: true`` with the engine's own counts
and timings in nanoseconds. Embeddings are ``/v1/embeddings``' vectors.

Errors name the field the client sent (``options.num_predict``, not chat's ``max_tokens``) and
take Ollama's shape, ``{"error": "..."}``, with Ollama's statuses (an unknown model is a 404),
through :func:`ruvllm.server.http.errors.surface_body`.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import attrs
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from ruvllm.errors import ContextLengthExceeded, InvalidRequest, ModelStoreReadOnly, RuvllmError
from ruvllm.guided.tools import ToolCall
from ruvllm.server.http.field_names import FieldNames, in_terms
from ruvllm.server.http.sse import SSEResponse
from ruvllm.server.lifecycle.answer_events import AnswerEvents
from ruvllm.server.lifecycle.answering import answer
from ruvllm.server.lifecycle.chat_run import prompt_reasoning, start_chat, thinks
from ruvllm.server.lifecycle.completion_run import start_completion
from ruvllm.server.lifecycle.completion_service import Outcome, Submission
from ruvllm.server.lifecycle.embeddings import (
    Embedded,
    check_dimensions,
    embed_inputs,
    require_embeddings,
    split_inputs,
)
from ruvllm.server.lifecycle.events import Event, Finish, Step, TokenLogprobs, logprob_entry
from ruvllm.server.lifecycle.model_pool import ModelPool, Route
from ruvllm.server.lifecycle.params import Limits, chat_prompt_ids, completion_prompts
from ruvllm.server.lifecycle.request_input import RequestInput
from ruvllm.server.ollama.ollama_models import Catalogue, iso_time, pool_name
from ruvllm.server.ollama.ollama_schemas import (
    OllamaChatRequest,
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaOptions,
    OllamaPullRequest,
    OllamaShowRequest,
    chat_request,
    check_generate,
    check_think,
    format_grammar,
    keep_alive_seconds,
    llama_cpp_params,
    refuse_embedding_options,
    sampling,
    top_logprobs,
)
from ruvllm.tokenizer import require_in_vocabulary

#: The Ollama release whose API this surface follows (``think``, ``tool_name``, ``logprobs``):
#: clients read ``/api/version`` to decide which features to use.
OLLAMA_VERSION = "0.13.0"

#: Chat's field -> the field an Ollama client sent, for the errors the shared core raises.
_OLLAMA_FIELDS = {
    "max_tokens": "options.num_predict", "temperature": "options.temperature", "top_p": "options.top_p",
    "top_k": "options.top_k", "min_p": "options.min_p", "seed": "options.seed", "stop": "options.stop",
    "presence_penalty": "options.presence_penalty", "frequency_penalty": "options.frequency_penalty",
    "repetition_penalty": "options.repeat_penalty", "guided_json": "format", "mirostat": "options.mirostat",
    "mirostat_tau": "options.mirostat_tau", "mirostat_eta": "options.mirostat_eta",
}

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


class NDJSONResponse(SSEResponse):
    """Ollama's stream: one JSON object per line. SSEResponse's closing (which cancels the
    engine requests when the client leaves) with NDJSON's media type."""

    media_type = "application/x-ndjson"


def _now() -> str:
    return iso_time(time.time())


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _line(obj: dict[str, Any]) -> str:
    return _encode(obj) + "\n"


def ollama_names(prompt_field: str, *, alternatives: bool = False) -> FieldNames:
    """The shared core's fields as an Ollama client sent them; the prompt is ``prompt_field``, and
    the logprobs ``top_logprobs`` where the client asked for ``alternatives``."""
    asked = {"logprobs": "top_logprobs"} if alternatives else {}
    return FieldNames.of({**_OLLAMA_FIELDS, **asked, "prompt": prompt_field, "input": prompt_field})


@contextlib.contextmanager
def _in_ollama_terms(prompt_field: str, num_ctx: int | None = None, *,
                     alternatives: bool = False) -> Iterator[None]:
    """Re-raise the shared core's refusals naming the field the Ollama client sent; a prompt
    that does not fit a smaller ``num_ctx`` names that option."""
    try:
        yield
    except ContextLengthExceeded as exc:
        if num_ctx is None or exc.context_length != num_ctx:
            raise InvalidRequest(prompt_field, str(exc).removeprefix("prompt: "), exc.value) from None
        asked = "" if exc.prompt_tokens >= num_ctx else f" and {exc.max_tokens} more were requested"
        raise InvalidRequest("options.num_ctx", f"the prompt has {exc.prompt_tokens} tokens{asked}, but "
                             f"num_ctx is {num_ctx}; raise num_ctx, shorten the {prompt_field} or lower "
                             "options.num_predict", num_ctx) from None
    except InvalidRequest as exc:
        ollama_names(prompt_field, alternatives=alternatives).renamed(exc)
        raise


def _num_ctx(options: OllamaOptions | None) -> int | None:
    return options.num_ctx if options is not None else None


def _request_limits(limits: Limits, num_ctx: int | None) -> Limits:
    """The server's limits with ``num_ctx`` as a tighter cap on prompt + answer: Ollama sizes
    the loaded context with it; here the server's context is fixed, so a smaller one bounds the
    request (a prompt that does not fit is a 400: nothing is cut) and a larger one changes
    nothing a request may use."""
    if num_ctx is None:
        return limits
    return attrs.evolve(limits, max_context=min(num_ctx, limits.max_context or num_ctx))


def _tool_call(call: ToolCall, index: int) -> dict[str, Any]:
    """A tool call as Ollama's (its arguments an object, as the model wrote them)."""
    return {"id": call.id, "function": {"index": index, "name": call.name, "arguments": call.arguments}}


def stream_error(exc: RuvllmError, names: FieldNames) -> str:
    """A failure after the stream started, as Ollama's ``{"error": ...}`` line naming the field
    the client sent (``names``: :func:`ollama_names`): this surface's one shape of an error
    inside a stream (the status was sent long ago; Ollama's clients raise it)."""
    return _line({"error": str(in_terms(exc, names))})


@attrs.frozen(kw_only=True)
class _Exchange:
    """One running ``/api/chat`` or ``/api/generate`` request, and how its objects look."""

    submission: Submission
    #: How the outputs are read as events (thinking, tool calls, logprobs).
    reading: AnswerEvents
    prompt_ids: list[int]
    #: The name the client sent: Ollama answers with it.
    model: str
    #: ``message`` objects (``/api/chat``), else ``response`` text (``/api/generate``).
    chat: bool
    #: ``time.monotonic_ns()`` when the request arrived, and the nanoseconds its model took to be ready.
    started: int
    load: int
    #: The shared core's fields as the client sent them, for a refusal after the answer started.
    names: FieldNames
    #: The last object carries the token context (``/api/generate`` without ``raw``).
    context: bool = False
    #: A thinking model's thinking comes back (``think`` not false), in ``thinking``.
    thinking: bool = True

    def piece(self, text: str, thinking: str | None, calls: Sequence[ToolCall],
              logprobs: Sequence[TokenLogprobs] | None, *, done: bool = False) -> dict[str, Any]:
        """One object: the answer's ``text``, its ``thinking`` (when shown), its tool calls (chat)
        and its tokens' ``logprobs`` (None: none to report)."""
        out: dict[str, Any] = {"model": self.model, "created_at": _now()}
        shown = {"thinking": thinking} if self.thinking and thinking else {}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text, **shown}
            if calls:
                message["tool_calls"] = [_tool_call(c, k) for k, c in enumerate(calls)]
            out["message"] = message
        else:
            out.update(response=text, **shown)
        if logprobs is not None:
            out["logprobs"] = [logprob_entry(t) for t in logprobs]
        out["done"] = done
        return out

    def final(self, finish: Finish, said: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``done: true`` object (``said``: the whole answer's piece, else an empty one): why
        it ended, the engine's counts and timings (ns)."""
        out = {**(said or self.piece("", None, (), None)), "done": True}
        result = finish.result
        out["done_reason"] = "length" if finish.reason == "length" else "stop"
        if self.context:
            out["context"] = [*self.prompt_ids, *result.token_ids]
        usage, timings = result.usage, result.timings
        out.update(total_duration=time.monotonic_ns() - self.started, load_duration=self.load,
                   prompt_eval_count=usage.prompt_tokens, prompt_eval_duration=_ns(timings.prefill),
                   eval_count=usage.completion_tokens, eval_duration=_ns(timings.decode))
        return out

    def lines(self) -> AsyncIterator[str]:
        """The stream: an object per token that has text (or thinking), the tool calls (chat)
        once the answer is complete, then the final object; a failure after the start is an
        ``{"error": ...}`` line (the status was sent long ago), which Ollama's clients raise."""
        choice = self.reading.choice()
        return self.submission.writes(lambda item: self._lines_of(choice.of(item)))

    def _lines_of(self, events: list[Event]) -> list[str]:
        """The lines of one step's events: what it says (thinking left out says nothing), then
        the final object when it ends the answer."""
        step = Step.of(events)
        thinking = step.thinking if self.thinking else ""
        lines = [_line(self.piece(step.text, thinking, step.calls, step.logprobs or None))] \
            if thinking or step.text or step.calls or step.logprobs else []
        if step.finish is not None:
            lines.append(_line(self.final(step.finish)))
        if step.failed is not None:
            lines.append(stream_error(step.failed.error, self.names))
        return lines

    async def answer(self, stream: bool, request: Request) -> Response:
        """The NDJSON stream, or the whole answer as one object (499 when the client left first)."""
        def whole(outcomes: list[Outcome]) -> Response:
            answer = self.reading.whole(*outcomes[0])
            said = self.piece(answer.text, answer.reasoning, answer.calls, answer.logprobs)
            return JSONResponse(self.final(answer.finish, said))

        with self.names.speaking():
            return await answer(self.submission, request, streamed=self.lines if stream else None,
                                whole=whole, stream_class=NDJSONResponse)


async def _generate_ids(route: Route, body: OllamaGenerateRequest) -> list[int]:
    """The prompt's token ids: as is with ``raw`` (tokenized as ``/v1/completions`` does), the
    fill-in-the-middle prompt with a ``suffix``, else the earlier ``context`` followed by the
    system and prompt in the model's chat template."""
    engine = route.engine
    if body.raw or body.suffix:
        return (await completion_prompts(engine, body.prompt, body.suffix))[0]
    context = body.context or []
    require_in_vocabulary("context", context, engine.info.vocab_size,
                          "; send the context an earlier answer of this model returned")
    turn = [{"role": "system", "content": body.system}] if body.system else []
    return [*context, *await chat_prompt_ids(engine, [*turn, {"role": "user", "content": body.prompt}])]


@contextlib.asynccontextmanager
async def _route(pool: ModelPool, model: str,
                 keep_alive: float | str | None = None) -> AsyncIterator[tuple[Route, int]]:
    """The request's route, and the nanoseconds its model took to be ready (Ollama's load_duration).
    ``keep_alive`` holds for the model from this request on, as in Ollama (the pool's reaper
    unloads it once idle that long)."""
    began = time.monotonic_ns()
    async with pool.route(pool_name(pool, model), keep_alive_seconds(keep_alive)) as route:
        yield route, time.monotonic_ns() - began


async def _load_or_unload(pool: ModelPool, model: str, keep_alive: float | str | None, *,
                          chat: bool) -> dict[str, Any]:
    """Ollama's answer to an empty prompt or conversation: the model is loaded and nothing is
    generated, or with ``keep_alive`` 0 it is unloaded (once no other request is using it)."""
    async with _route(pool, model, keep_alive):
        pass
    unload = keep_alive_seconds(keep_alive) == 0
    if unload:
        await pool.reap()
    said = {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return {"model": model, "created_at": _now(), **said, "done": True,
            "done_reason": "unload" if unload else "load"}


def _refuse_store_change(endpoint: str):
    """The handler of an Ollama route that would change the model store (see ModelStoreReadOnly)."""
    async def refuse() -> Response:
        raise ModelStoreReadOnly(endpoint)
    return refuse


def register_ollama_routes(app: FastAPI, pool: ModelPool, limits: Limits) -> None:
    """Ollama's routes on ``app``, serving ``pool``'s models within the server's ``limits``."""
    catalogue = Catalogue(pool, limits)

    @app.post("/api/chat")
    async def chat(body: OllamaChatRequest, request: Request) -> Response:
        started = time.monotonic_ns()
        if not body.messages:
            return JSONResponse(await _load_or_unload(pool, body.model, body.keep_alive, chat=True))
        with _in_ollama_terms("messages"):
            chat_body = chat_request(body)
        async with _route(pool, body.model, body.keep_alive) as (route, load):
            check_think(body.think, thinks(route, limits))
            num_ctx = _num_ctx(body.options)
            with _in_ollama_terms("messages", num_ctx, alternatives=bool(body.top_logprobs)):
                run = await start_chat(route, chat_body, _request_limits(limits, num_ctx), id_prefix="ollama",
                                       extra_params=llama_cpp_params(body.options,
                                                                     route.engine.capabilities.core_sampler))
            exchange = _Exchange(submission=run.submission, reading=run.reading,
                                 prompt_ids=run.prompt_ids, model=body.model, chat=True, started=started,
                                 load=load, thinking=body.think is not False, names=ollama_names("messages"))
            return await exchange.answer(body.stream is not False, request)

    @app.post("/api/generate")
    async def generate(body: OllamaGenerateRequest, request: Request) -> Response:
        started = time.monotonic_ns()
        check_generate(body)
        if not body.prompt:
            return JSONResponse(await _load_or_unload(pool, body.model, body.keep_alive, chat=False))
        logprobs = top_logprobs(body)
        asked = sampling(body.options)
        async with _route(pool, body.model, body.keep_alive) as (route, load):
            engine = route.engine
            templated = not body.raw and not body.suffix
            check_think(body.think, templated and thinks(route, limits))
            if logprobs is not None and not engine.capabilities.logprobs:
                raise InvalidRequest("logprobs", "this model's backend cannot report logprobs (see "
                                     "`ruvllm backends`)")
            num_ctx = _num_ctx(body.options)
            with _in_ollama_terms("prompt", num_ctx):
                ids = await _generate_ids(route, body)
                extra = {"logprobs": logprobs,
                         **llama_cpp_params(body.options, engine.capabilities.core_sampler)}
                completion = RequestInput(sampling=asked, grammar=format_grammar(body.format))
                run = await start_completion(route, completion, [ids],
                                             _request_limits(limits, num_ctx), id_prefix="ollama",
                                             adjust=lambda params: attrs.evolve(params, **extra))
            reading = AnswerEvents(engine.tokenizer, logprobs,
                                   prompt_reasoning(route, limits, ids) if templated else None)
            exchange = _Exchange(submission=run.submission, reading=reading, prompt_ids=ids, model=body.model,
                                 chat=False, started=started, load=load, context=templated,
                                 thinking=body.think is not False, names=ollama_names("prompt"))
            return await exchange.answer(body.stream is not False, request)

    @app.get("/api/tags")
    async def tags() -> dict[str, Any]:
        return {"models": [catalogue.details(name, entry) for name, entry in catalogue.models()]}

    @app.get("/api/ps")
    async def ps() -> dict[str, Any]:
        return {"models": catalogue.running()}

    @app.post("/api/show")
    async def show(body: OllamaShowRequest) -> dict[str, Any]:
        async with _route(pool, body.model) as (route, _):
            return catalogue.show(route)

    async def vectors_of(model: str, inputs: list[str | list[int]],
                         keep_alive: float | str | None) -> tuple[Embedded, int]:
        """The inputs embedded (as /v1/embeddings' vectors) and the model's load time."""
        async with _route(pool, model, keep_alive) as (route, load):
            require_embeddings(route, model, "/api/embed")
            return await embed_inputs(route.engine, inputs), load

    @app.post("/api/embed")
    async def embed(body: OllamaEmbedRequest) -> dict[str, Any]:
        started = time.monotonic_ns()
        refuse_embedding_options(body.options)
        check_dimensions(body.dimensions)
        # Ollama answers an empty input with no vectors (having loaded the model).
        inputs = split_inputs(body.input) if body.input not in ("", []) else []
        embedded, load = await vectors_of(body.model, inputs, body.keep_alive)
        return {"model": body.model, "embeddings": [v.tolist() for v in embedded.vectors],
                "total_duration": time.monotonic_ns() - started, "load_duration": load,
                "prompt_eval_count": embedded.tokens}

    @app.post("/api/embeddings")
    async def embeddings(body: OllamaEmbeddingsRequest) -> dict[str, Any]:
        """Ollama's older endpoint: one prompt, one vector (normalised here, as /api/embed's)."""
        refuse_embedding_options(body.options)
        with _in_ollama_terms("prompt"):
            embedded, _ = await vectors_of(body.model, [body.prompt] if body.prompt else [], body.keep_alive)
        return {"embedding": embedded.vectors[0].tolist() if body.prompt else []}

    @app.get("/api/version")
    async def version() -> dict[str, str]:
        return {"version": OLLAMA_VERSION}

    @app.post("/api/pull")
    async def pull(body: OllamaPullRequest) -> Response:
        """A served model is here already, so pulling it (what ``ollama run`` and chat UIs send
        before first use) succeeds at once, downloading and loading nothing; another name is the
        404 naming the served models."""
        pool_name(pool, body.model)
        done = {"status": "success"}
        if body.stream is False:
            return JSONResponse(done)
        return Response(_line(done), media_type=NDJSONResponse.media_type)

    for endpoint in ("/api/delete", "/api/copy", "/api/create", "/api/push"):
        app.add_api_route(endpoint, _refuse_store_change(endpoint), methods=["POST", "DELETE"],
                          include_in_schema=False)

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def running() -> PlainTextResponse:
        """What Ollama answers at its root: its own CLI (``OLLAMA_HOST=... ollama run``) and other
        clients probe ``HEAD /`` before anything else."""
        return PlainTextResponse("Ollama is running")
