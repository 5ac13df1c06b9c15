"""llama-server's own API on the same engine: ``/completion``, ``/infill`` and ``/apply-template``.

Scripts written for llama-server post text or token ids to ``/completion`` and read its
objects (``content``, ``stop_type``, ``timings``...); editor plugins (llama.vim, llama.vscode)
post the text around the cursor to ``/infill``. A thin surface, as the Ollama one is: the body
is checked in llama-server's terms (:mod:`ruvllm.server.llama_server.llama_server_schemas`), runs through
the :class:`~ruvllm.server.lifecycle.completion_service.CompletionService` every completion shares (one
sampler, core's stop strings, grammar, limits) and comes back in llama-server's objects; a
stream is server-sent events, one object per token, the last one ``"stop": true``.

Two stops are llama-server's own, made for editors, and live here: ``n_indent`` ends the answer
at the first line less indented than the cursor (and cuts that line), ``t_max_predict_ms`` ends
it at the first new line past the time limit (so an editor gets whole lines). Both end the engine request
at once (its KV is freed) and report ``stop_type: "limit"``, as llama-server does.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import attrs
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ruvllm.errors import InvalidRequest, RuvllmError
from ruvllm.fim import extra_pieces, fit_infill, infill_ids
from ruvllm.guided.tools import plan_tools
from ruvllm.server.http.chat_messages import message_dicts
from ruvllm.server.http.errors import ruvllm_error_body
from ruvllm.server.http.field_names import FieldNames, in_terms
from ruvllm.server.http.sse import sse_event
from ruvllm.server.lifecycle import answering
from ruvllm.server.lifecycle.completion_run import start_completion
from ruvllm.server.lifecycle.completion_service import CompletionService, Submission
from ruvllm.server.lifecycle.model_pool import ModelPool, Route
from ruvllm.server.lifecycle.params import Limits, chat_prompt_text, penalty_window, piece_ids, prompt_head
from ruvllm.server.lifecycle.request_input import RequestInput, Sampling
from ruvllm.server.llama_server.llama_server_schemas import (
    ApplyTemplateRequest,
    LlamaCompletionRequest,
    LlamaInfillRequest,
    bias_entries,
    grammar,
    infill_sampling,
    llama_sampler_params,
    samplers_run,
    sampling,
    temperature_last,
)
from ruvllm.serving import AsyncEngine
from ruvllm.tokenizer import require_in_vocabulary
from ruvllm.types import FinishReason, GenerationParams, GenerationResult, TokenOutput

#: Completion request field -> the field a llama-server client sent, for the shared core's errors.
_LLAMA_FIELDS = {"max_tokens": "n_predict", "repetition_penalty": "repeat_penalty", "logprobs": "n_probs",
                 "guided_json": "json_schema", "guided_grammar": "grammar", "infill_sampling": "samplers",
                 "temperature_last": "samplers"}


def llama_names(prompt_field: str = "prompt") -> FieldNames:
    """The shared core's fields as a llama-server client sent them; the prompt is ``prompt_field``."""
    return FieldNames.of({**_LLAMA_FIELDS, "prompt": prompt_field})


async def _prompt_ids(engine: AsyncEngine, prompt: str | list[int | str], at: str) -> list[int]:
    """One prompt's ids, tokenized as llama-server does: text gets the model's BOS (where it wants
    one) when it comes first, and special tokens written as text are parsed (a prompt built with
    the chat template by hand keeps its control tokens); the code around an ``/infill`` gap and a
    ``logit_bias`` text are tokenized plainly."""
    pieces = [prompt] if isinstance(prompt, str) else prompt
    ids: list[int] = []
    for k, piece in enumerate(pieces):
        ids += [piece] if isinstance(piece, int) else \
            await piece_ids(engine, at, piece, bos=k == 0, parse_special=True)
    if not ids:
        raise InvalidRequest(at, "must not be empty")
    require_in_vocabulary(at, ids, engine.info.vocab_size)
    return ids


def _prompts(prompt: Any) -> list[tuple[str, Any]]:
    """(field path, prompt) of each prompt: one prompt, or a list of them."""
    mixed = all(isinstance(p, int | str) for p in prompt) and any(isinstance(p, int) for p in prompt)
    if isinstance(prompt, str) or mixed:
        return [("prompt", prompt)]
    return [(f"prompt[{k}]", p) for k, p in enumerate(prompt)]


async def _infill_ids(engine: AsyncEngine, body: LlamaInfillRequest, context: int) -> list[int]:
    """The fill-in-the-middle prompt llama-server builds from an editor's context (ruvllm.fim)."""
    fim = engine.info.special_tokens.fim
    if fim is None:
        raise InvalidRequest("input_suffix", "this model has no fill-in-the-middle tokens, so it cannot "
                             "write what goes between input_prefix and input_suffix; serve a code model "
                             "trained for it (Qwen2.5-Coder, StarCoder2, DeepSeek-Coder; docs/server.md)")
    extra: list[int] = []
    files = [(chunk.filename, chunk.text) for chunk in body.input_extra]
    for piece in extra_pieces(fim, files):
        extra += [piece] if isinstance(piece, int) else await piece_ids(engine, "input_extra", piece)
    prefix, suffix, line, extra = (
        await piece_ids(engine, "input_prefix", body.input_prefix),
        await piece_ids(engine, "input_suffix", body.input_suffix),
        await piece_ids(engine, "prompt", body.prompt), extra)
    prefix, suffix, extra = fit_infill(prefix, suffix, line, extra, context=context,
                                       max_tokens=max(body.n_predict, 0))
    return infill_ids(fim, prompt_head(engine), prefix, suffix, line=line, extra=extra)


async def _bias(engine: AsyncEngine, body: LlamaCompletionRequest) -> dict[str, float]:
    """``logit_bias`` by token id; a text's bias goes to each of its tokens, as in llama-server."""
    out: dict[str, float] = {}
    for key, weight in bias_entries(body.logit_bias):
        ids = [key] if isinstance(key, int) else await piece_ids(engine, "logit_bias", key)
        require_in_vocabulary("logit_bias", ids, engine.info.vocab_size)
        out.update({str(t): weight for t in ids})
    return out


def _under_indented(text: str, n_indent: int) -> int | None:
    """Where the text of the first line after a new line that is indented less than ``n_indent``
    starts (spaces and tabs count one each, as in llama-server); None while every line is in."""
    start = text.find("\n")
    while start != -1:
        end = text.find("\n", start + 1)
        line = text[start + 1:] if end == -1 else text[start + 1:end]
        indent = len(line) - len(line.lstrip(" \t"))
        if indent < len(line) and indent < n_indent:
            return start + 1 + indent
        start = end
    return None


def runs_temperature_last(body: LlamaCompletionRequest, engine: AsyncEngine) -> bool:
    """llama.cpp's order where core samples; a backend that samples by itself (mistral.rs) keeps
    its own unless the client's chain asks for llama.cpp's, which it then refuses by name."""
    return temperature_last(body) and (body.samplers is not None or engine.capabilities.core_sampler)


def llama_cpp_rules(params: GenerationParams, body: LlamaCompletionRequest,
                    engine: AsyncEngine) -> GenerationParams:
    """``params`` under llama.cpp's rules where they apply: its sampler order
    (:func:`runs_temperature_last`) and its penalty window (``repeat_last_n``,
    :func:`ruvllm.server.lifecycle.params.penalty_window`)."""
    window = penalty_window("repeat_last_n", body.repeat_last_n, params.has_penalties,
                            engine.capabilities.core_sampler)
    return attrs.evolve(params, temperature_last=runs_temperature_last(body, engine), penalty_last_n=window,
                        **llama_sampler_params(body))


def generation_settings(params: GenerationParams, body: LlamaCompletionRequest, *, context: int,
                        model: str) -> dict[str, Any]:
    """llama-server's ``generation_settings``: what an answer to ``body`` is made with."""
    seed = params.seed if params.seed is not None else -1
    return {"n_ctx": context, "n_predict": 0 if body.n_predict == 0 else params.max_tokens, "seed": seed,
            "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
            "min_p": params.min_p, "repeat_penalty": params.repetition_penalty,
            "repeat_last_n": -1 if params.penalty_last_n is None else params.penalty_last_n,
            "typical_p": params.typical_p,
            "top_n_sigma": params.top_n_sigma if params.top_n_sigma > 0 else -1.0,
            "xtc_probability": params.xtc_probability, "xtc_threshold": params.xtc_threshold,
            "dynatemp_range": params.dynatemp_range, "dynatemp_exponent": params.dynatemp_exponent,
            "mirostat": params.mirostat, "mirostat_tau": params.mirostat_tau,
            "mirostat_eta": params.mirostat_eta, "dry_multiplier": params.dry_multiplier,
            "dry_base": params.dry_base, "dry_allowed_length": params.dry_allowed_length,
            "dry_penalty_last_n": params.dry_penalty_last_n,
            "dry_sequence_breakers": list(params.dry_sequence_breakers),
            "presence_penalty": params.presence_penalty, "frequency_penalty": params.frequency_penalty,
            "stop": list(params.stop), "ignore_eos": params.ignore_eos, "n_probs": body.n_probs,
            "n_indent": body.n_indent, "t_max_predict_ms": body.t_max_predict_ms, "stream": body.stream,
            "samplers": samplers_run(body, last=params.temperature_last), "model": model}


@attrs.define
class _Answer:
    """One answer being written, with llama-server's editor stops applied as tokens arrive."""

    index: int
    prompt_ids: list[int]
    params: GenerationParams
    n_indent: int = 0
    max_predict_ms: int = 0
    text: str = ""
    token_ids: list[int] = attrs.Factory(list)
    probabilities: list[dict[str, Any]] = attrs.Factory(list)
    first_token_at: float | None = None
    #: An editor stop ended it (the engine request was cancelled for it).
    stopped_early: bool = False
    #: ``n_predict`` 0: the prompt is evaluated into the prefix cache (llama.vim warms it with
    #: the project's files this way) and nothing is written. The engine computes a prompt only
    #: for a token, so one is sampled and dropped.
    evaluate_only: bool = False

    def add(self, out: TokenOutput, probability: dict[str, Any] | None) -> str:
        """Record one token; the text that goes out for it (cut where an editor stop ends the answer)."""
        sent = len(self.text)
        self.text += out.text
        if out.token_id is not None:
            self.token_ids.append(out.token_id)
        if probability is not None:
            self.probabilities.append(probability)
        now = time.monotonic()
        self.first_token_at = self.first_token_at or now
        cut = _under_indented(self.text, self.n_indent) if self.n_indent else None
        if cut is not None:
            self.text = self.text[:max(cut, sent)]
            self.stopped_early = True
        elif self.max_predict_ms and "\n" in out.text and \
                (now - self.first_token_at) * 1000 > self.max_predict_ms:
            self.stopped_early = True
        return self.text[sent:]


def stream_error(exc: RuvllmError, names: FieldNames) -> dict[str, Any]:
    """A failure after the answer started, as llama-server's ``error`` object (OpenAI's fields,
    its ``code`` the status) naming the field the client sent (``names``: :func:`llama_names`):
    this surface's one shape of an error inside a stream, and of the whole answer's first error."""
    status, error, _ = ruvllm_error_body(in_terms(exc, names))
    return {"error": {**error["error"], "code": status}}


@attrs.frozen(kw_only=True)
class _Exchange:
    """One ``/completion`` or ``/infill`` request: its answers, and how llama-server shows them."""

    submission: Submission
    answers: dict[int, _Answer]
    engine: AsyncEngine
    model: str
    body: LlamaCompletionRequest
    context: int
    #: The shared core's fields as the client sent them, for a refusal after the answer started.
    names: FieldNames

    def _probability(self, out: TokenOutput) -> dict[str, Any] | None:
        """llama-server's ``completion_probabilities`` entry of a sampled token."""
        if not self.body.n_probs or out.token_id is None or out.logprob is None:
            return None
        tok = self.engine.tokenizer

        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            text = tok.token_text(token_id)
            return {"id": token_id, "token": text, "bytes": list(text.encode("utf-8", "replace")),
                    "logprob": logprob}

        return {**entry(out.token_id, out.logprob),
                "top_logprobs": [entry(t.token_id, t.logprob) for t in out.top_logprobs[: self.body.n_probs]]}

    def _settings(self, params: GenerationParams) -> dict[str, Any]:
        return generation_settings(params, self.body, context=self.context, model=self.model)

    def _final(self, answer: _Answer, result: GenerationResult) -> dict[str, Any]:
        """The ``"stop": true`` object: why it ended, the counts and the timings (ms)."""
        if answer.stopped_early or result.finish_reason is FinishReason.LENGTH:
            stop_type, word = "limit", ""
        elif isinstance(result.stop_reason, str):
            stop_type, word = "word", result.stop_reason
        else:
            stop_type, word = "eos", ""
        predicted = len(answer.token_ids) if answer.stopped_early or answer.evaluate_only \
            else result.usage.completion_tokens
        prompt_ms, predicted_ms = result.timings.prefill * 1000, result.timings.decode * 1000
        # As llama-server counts: the prompt tokens read from the cache, and those computed.
        cached = result.usage.cached_prompt_tokens
        computed = len(answer.prompt_ids) - cached
        stream = self.body.stream
        out: dict[str, Any] = {
            "index": answer.index, "content": "" if stream else answer.text,
            "tokens": answer.token_ids if self.body.return_tokens and not stream else [],
            "id_slot": -1, "stop": True, "model": self.model, "tokens_predicted": predicted,
            "tokens_evaluated": len(answer.prompt_ids), "generation_settings": self._settings(answer.params),
            "prompt": self.engine.tokenizer.decode(answer.prompt_ids, skip_special=False),
            "has_new_line": "\n" in answer.text, "truncated": False, "stop_type": stop_type,
            "stopping_word": word, "tokens_cached": cached,
            "timings": {"cache_n": cached, "prompt_n": computed, "prompt_ms": prompt_ms,
                        "prompt_per_token_ms": prompt_ms / computed if computed else 0.0,
                        "prompt_per_second": computed / result.timings.prefill
                        if result.timings.prefill else 0.0,
                        "predicted_n": predicted, "predicted_ms": predicted_ms,
                        "predicted_per_token_ms": predicted_ms / predicted if predicted else 0.0,
                        "predicted_per_second": predicted / result.timings.decode
                        if result.timings.decode else 0.0}}
        if self.body.n_probs and not stream:
            out["completion_probabilities"] = answer.probabilities
        return _fields(out, self.body.response_fields)

    def _piece(self, answer: _Answer, text: str, out: TokenOutput) -> dict[str, Any]:
        """A streamed token's object."""
        piece: dict[str, Any] = {"index": answer.index, "content": text,
                                 "tokens": [] if out.token_id is None else [out.token_id], "stop": False,
                                 "id_slot": -1, "tokens_predicted": len(answer.token_ids),
                                 "tokens_evaluated": len(answer.prompt_ids)}
        if self.body.n_probs and answer.probabilities and out.token_id is not None:
            piece["completion_probabilities"] = [answer.probabilities[-1]]
        return piece

    async def objects(self) -> AsyncIterator[tuple[bool, dict[str, Any]]]:
        """``(last, object)`` as the answers are written: a token's object (with text, or with an
        id that completes none yet), each answer's final object, or an ``error`` object. Closing
        it cancels what is still running."""
        batches = self.submission.stream()
        try:
            async for batch in batches:
                for index, item in batch.items:
                    answer = self.answers[index]
                    if isinstance(item, TokenOutput):
                        if answer.stopped_early or answer.evaluate_only:
                            continue  # sent before the cancel reached the engine, or nothing is written
                        text = answer.add(item, self._probability(item))
                        if answer.stopped_early:
                            self.submission.cancel_choice(index)
                        if text or item.token_id is not None:
                            yield False, self._piece(answer, text, item)
                    elif isinstance(item, GenerationResult):
                        yield True, self._final(answer, item)
                    else:
                        yield True, stream_error(item, self.names)
                if batch.last:
                    return
        finally:
            await batches.aclose()

    async def answer(self, request: Request) -> Response:
        """The event stream, or the final objects (one, or a list for several prompts)."""
        def streamed() -> AsyncIterator[str]:
            return (sse_event(obj) async for _, obj in self.objects())

        return await answering.answer(self.submission, request,
                                      streamed=streamed if self.body.stream else None, read_whole=self._whole)

    async def _whole(self) -> Response:
        """The final objects (one, or a list for several prompts) once every answer ended, or the
        first error."""
        finals: list[dict[str, Any]] = []
        objects = self.objects()
        try:
            async for last, obj in objects:
                if "error" in obj:
                    return JSONResponse({"error": obj["error"]}, status_code=obj["error"]["code"])
                if last:
                    finals.append(obj)
        finally:
            await objects.aclose()
        finals.sort(key=lambda o: o.get("index", 0))
        return JSONResponse(finals[0] if len(finals) == 1 else finals)


def _fields(obj: dict[str, Any], paths: Sequence[str] | None) -> dict[str, Any]:
    """llama-server's ``response_fields``: only those paths (``timings/prompt_n`` is that nested
    value under its whole path's name); a path the object lacks is left out."""
    if paths is None:
        return obj
    out: dict[str, Any] = {}
    for path in paths:
        value: Any = obj
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            out[path] = value
    return out


async def _start(route: Route, limits: Limits, body: LlamaCompletionRequest, asked: Sampling,
                 prompts: list[list[int]]) -> _Exchange:
    """Submit one answer per prompt with ``asked`` (llama_server_schemas.sampling): the shared
    core's checks, with the fields llama-server's."""
    engine = route.engine
    if body.n_probs and not engine.capabilities.logprobs:
        raise InvalidRequest("n_probs", "this model's backend cannot report logprobs (see `ruvllm backends`)")
    names = llama_names("input_prefix" if isinstance(body, LlamaInfillRequest) else "prompt")
    with names.speaking():
        bias = await _bias(engine, body) or None
        if body.n_cmpl > limits.max_n:
            raise InvalidRequest("n_cmpl", f"must be at most {limits.max_n} on this server (max_n); got "
                                 f"{body.n_cmpl}", body.n_cmpl)

        def rules(params: GenerationParams) -> GenerationParams:
            """llama.cpp's: ``n_predict: 0`` evaluates the prompt only, its sampler rules, n_probs."""
            if body.n_predict == 0:
                params = attrs.evolve(params, max_tokens=1)
            return attrs.evolve(llama_cpp_rules(params, body, engine), logprobs=body.n_probs or None,
                                infill_sampling=infill_sampling(body))

        # n_cmpl answers per prompt, prompt after prompt: the completion's n choices.
        completion = RequestInput(n=body.n_cmpl, sampling=attrs.evolve(asked, logit_bias=bias),
                                  grammar=grammar(body))
        run = await start_completion(route, completion, prompts, limits, id_prefix="llama", adjust=rules)
    answers = {c.index: _Answer(index=c.index, prompt_ids=c.prompt_ids, n_indent=body.n_indent,
                                max_predict_ms=body.t_max_predict_ms, evaluate_only=body.n_predict == 0,
                                params=c.params) for c in run.choices}
    return _Exchange(submission=run.submission, answers=answers, engine=engine, model=route.served_name,
                     body=body, context=run.context_length, names=names)


def register_llama_server_routes(app: FastAPI, pool: ModelPool, limits: Limits) -> None:
    """llama-server's ``/completion``, ``/infill`` and ``/apply-template`` on ``app``."""

    @app.post("/completion")
    async def completion(body: LlamaCompletionRequest, request: Request) -> Response:
        asked = sampling(body)
        async with pool.route(body.model) as route:
            prompts = [await _prompt_ids(route.engine, p, at) for at, p in _prompts(body.prompt)]
            exchange = await _start(route, limits, body, asked, prompts)
            return await exchange.answer(request)

    @app.post("/infill")
    async def infill(body: LlamaInfillRequest, request: Request) -> Response:
        asked = sampling(body)
        async with pool.route(body.model) as route:
            context = CompletionService(route, limits).context_length
            prompt = await _infill_ids(route.engine, body, context)
            exchange = await _start(route, limits, body, asked, [prompt])
            return await exchange.answer(request)

    @app.post("/apply-template")
    async def apply_template(body: ApplyTemplateRequest) -> dict[str, str]:
        """The conversation in the model's chat template, as chat renders it, for a client that
        edits the prompt before it sends it to ``/completion``."""
        async with pool.route(body.model) as route:
            engine = route.engine
        tools = plan_tools(body.tools, None, None, engine.info.chat_template)
        messages = message_dicts(body.messages)
        return {"prompt": chat_prompt_text(engine, messages, tools, body.template_options())}
