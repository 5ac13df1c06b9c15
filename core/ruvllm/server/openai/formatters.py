"""OpenAI's JSON shapes (chat.completion, text_completion and their chunks): one renderer among
the surfaces'. A chat answer comes as the lifecycle's neutral events, which the Responses API,
Anthropic and Ollama render too; a text completion is its tokens' text as is.

Usage is the engine's own token count: prompt tokens once per distinct prompt, completion
tokens summed over every choice, as OpenAI bills them. Where speculative decoding drafted tokens
for the choices, usage also carries ``draft_tokens`` and ``accepted_draft_tokens`` (extension
fields: how many were proposed, and how many of them are part of ``completion_tokens``).
"""

from __future__ import annotations

import abc
import json
import time
from collections.abc import Mapping, Sequence
from json.encoder import encode_basestring
from typing import Any, Protocol

from ruvllm.guided.tools import ToolCall, ToolPlan
from ruvllm.reasoning import Reasoning
from ruvllm.server.http.sse import sse_event
from ruvllm.server.lifecycle.answer_events import AnswerEvents, ChoiceEvents
from ruvllm.server.lifecycle.chat_run import ChatRun
from ruvllm.server.lifecycle.events import Event, Step, TokenLogprobs, logprob_entry
from ruvllm.tokenizer import Tokenizer
from ruvllm.types import GenerationResult, TokenLogprob, TokenOutput


def cached_tokens(results: Sequence[GenerationResult], prompts: int) -> int:
    """The prompt tokens read from the prefix cache, counted as ``prompt_tokens`` are: once per
    prompt, for the part of it none of its choices computed. ``results`` are in choice order
    (each prompt's ``n`` choices together)."""
    if not results:
        return 0
    n = max(1, len(results) // max(prompts, 1))
    return sum(min(r.usage.cached_prompt_tokens for r in results[start:start + n])
               for start in range(0, len(results), n))


def usage(prompt_tokens: int, completion_tokens: int, results: Sequence[GenerationResult] = (), *,
          prompts: int = 1, predicted: bool = False) -> dict[str, Any]:
    """OpenAI's usage object, with ``prompt_tokens_details.cached_tokens`` (:func:`cached_tokens`
    of ``results``, in choice order, for ``prompts`` prompts); with the draft counts of
    ``results`` when any were drafted, and with ``predicted`` (the request sent a predicted
    output, which drafted for it) OpenAI's ``accepted_prediction_tokens`` /
    ``rejected_prediction_tokens``."""
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens,
                           "prompt_tokens_details": {"cached_tokens": cached_tokens(results, prompts)}}
    drafted = sum(r.usage.draft_tokens for r in results)
    accepted = sum(r.usage.accepted_draft_tokens for r in results)
    if drafted:
        out["draft_tokens"] = drafted
        out["accepted_draft_tokens"] = accepted
    if predicted:
        out["completion_tokens_details"] = {"accepted_prediction_tokens": accepted,
                                            "rejected_prediction_tokens": drafted - accepted}
    return out


class ChunkFormatter(Protocol):
    def opening(self, index: int) -> dict[str, Any] | None: ...

    def token(self, index: int, out: TokenOutput) -> dict[str, Any] | None: ...

    def token_event(self, index: int, out: TokenOutput) -> str | None: ...

    def finish(self, index: int, result: GenerationResult) -> dict[str, Any]: ...

    def finish_event(self, index: int, result: GenerationResult) -> str: ...

    def usage(self, prompt_tokens: int, completion_tokens: int,
              results: Sequence[GenerationResult] = (), prompts: int = 1) -> dict[str, Any]: ...

    def complete(self, outcomes: Sequence[tuple[list[TokenOutput], GenerationResult]],
                 prompt_lengths: Sequence[int]) -> dict[str, Any]: ...

    def with_vllm_fields(self, response: dict[str, Any],
                       results: Sequence[GenerationResult]) -> dict[str, Any]: ...


def prompt_logprob_dicts(result: GenerationResult, top: int) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's ``prompt_logprobs`` of ``result``: per prompt position (None for the first, which
    nothing precedes) the prompt's token and the ``top`` most probable, by token id, each with
    its logprob, its rank (1 + the tokens more probable) and its text."""
    assert result.prompt_logprobs is not None, "prompt logprobs were asked of the engine"
    out: list[dict[str, dict[str, Any]] | None] = []
    for entry in result.prompt_logprobs:
        if entry is None:
            out.append(None)
            continue
        alternatives = entry.top_logprobs[:top]
        position = {str(t.token_id): {"logprob": t.logprob, "decoded_token": t.text,
                                      "rank": 1 + sum(o.logprob > t.logprob for o in alternatives)}
                    for t in alternatives}
        position[str(entry.token_id)] = {"logprob": entry.logprob, "rank": entry.rank,
                                         "decoded_token": entry.text}
        out.append(position)
    return out


class _Base(abc.ABC):
    object_name = ""
    chunk_name = ""
    #: Where vLLM puts ``prompt_token_ids``: in each choice (completions) or once at the top (chat).
    prompt_ids_per_choice = False

    def __init__(self, response_id: str, model: str, tokenizer: Tokenizer, logprobs: int | None, *,
                 predicted: bool = False):
        """``predicted``: the request sent a predicted output (its usage reports the prediction's
        tokens)."""
        self.predicted = predicted
        self.id = response_id
        self.model = model
        self.tok = tokenizer
        self.logprobs = logprobs
        self.created = int(time.time())
        self._templates: dict[int, tuple[str, str]] = {}
        #: vLLM's ``return_token_ids`` (:meth:`return_token_ids`): each choice's prompt ids, the
        #: ids streamed since its last chunk, and how many it has had.
        self._prompt_ids: dict[int, list[int]] | None = None
        self._pending: dict[int, list[int]] = {}
        self._noted: dict[int, int] = {}
        #: vLLM's ``prompt_logprobs``: the alternatives listed per prompt position (None: not asked).
        self._prompt_top: int | None = None
        self._as_ids = False

    def answer_as_asked(self, body: Any, prompts: Mapping[int, Sequence[int]]) -> None:
        """Follow the answer options a chat or completions ``body`` sets (vLLM's
        ``return_token_ids``, ``prompt_logprobs``, ``return_tokens_as_token_ids``); ``prompts``:
        choice index -> its prompt's ids."""
        if body.return_token_ids:
            self.return_token_ids(prompts)
        if body.prompt_logprobs is not None:
            self.return_prompt_logprobs(body.prompt_logprobs)
        if body.return_tokens_as_token_ids:
            self.return_tokens_as_token_ids()

    def return_prompt_logprobs(self, top: int) -> None:
        """Answer with vLLM's ``prompt_logprobs``: per prompt position (None for the first) the
        prompt token and the ``top`` most probable, each with its logprob, rank and text."""
        self._prompt_top = top

    def return_token_ids(self, prompts: Mapping[int, Sequence[int]]) -> None:
        """Answer with vLLM's ``return_token_ids``: the prompt's ids (``prompts``: choice index ->
        its prompt's ids) and each choice's own, so that a client can continue from tokens rather
        than re-tokenize text (agent and RL frameworks). A stream sends the prompt's with a
        choice's first chunk and, in every chunk, the ids of the tokens since the one before
        (one the chunk could not carry text for rides with the next)."""
        self._prompt_ids = {i: list(ids) for i, ids in prompts.items()}

    def _take_ids(self, index: int) -> list[int]:
        return self._pending.pop(index, [])

    def _note(self, index: int, token_ids: Sequence[int]) -> None:
        self._pending.setdefault(index, []).extend(token_ids)
        self._noted[index] = self._noted.get(index, 0) + len(token_ids)

    def _with_prompt_ids(self, index: int, chunk: dict[str, Any]) -> dict[str, Any]:
        """``chunk`` (choice ``index``'s first) with its prompt's ids, where vLLM puts them."""
        if self._prompt_ids is not None:
            where = chunk["choices"][0] if self.prompt_ids_per_choice else chunk
            where["prompt_token_ids"] = self._prompt_ids[index]
        return chunk

    def with_vllm_fields(self, response: dict[str, Any],
                         results: Sequence[GenerationResult]) -> dict[str, Any]:
        """A whole ``response`` with what :meth:`return_token_ids` and
        :meth:`return_prompt_logprobs` asked for (``results`` in choice order), where vLLM puts
        them: the prompt's once at the top of a chat answer, in each choice of a completion."""
        prompt_fields: list[dict[str, Any]] = [{} for _ in results]
        if self._prompt_ids is not None:
            for index, (choice, result) in enumerate(zip(response["choices"], results, strict=True)):
                prompt_fields[index]["prompt_token_ids"] = self._prompt_ids[index]
                choice["token_ids"] = list(result.token_ids)
        if self._prompt_top is not None:
            for index, result in enumerate(results):
                prompt_fields[index]["prompt_logprobs"] = prompt_logprob_dicts(result, self._prompt_top)
        if self.prompt_ids_per_choice:
            for choice, fields in zip(response["choices"], prompt_fields, strict=True):
                choice.update(fields)
        elif prompt_fields:
            response.update(prompt_fields[0])
        return response

    def _envelope(self, name: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": name, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices}

    def usage(self, prompt_tokens: int, completion_tokens: int,
              results: Sequence[GenerationResult] = (), prompts: int = 1) -> dict[str, Any]:
        out = self._envelope(self.chunk_name, [])
        out["usage"] = usage(prompt_tokens, completion_tokens, results, prompts=prompts,
                             predicted=self.predicted)
        return out

    def return_tokens_as_token_ids(self) -> None:
        """vLLM's ``return_tokens_as_token_ids``: logprobs name each token ``token_id:<id>``, so a
        token whose text is not valid on its own (part of a character) is still identified."""
        self._as_ids = True

    def _shown(self, token_id: int | None, text: str) -> str:
        """How a logprobs entry names a token: its text, or ``token_id:<id>`` where asked."""
        return f"token_id:{token_id}" if self._as_ids and token_id is not None else text

    def _token_text(self, out: TokenOutput) -> str:
        return self._shown(out.token_id, self.tok.token_text(out.token_id) if out.token_id is not None
                           else out.text)

    def _reports_lp(self, out: TokenOutput) -> bool:
        """Whether ``out`` gets a logprobs entry: asked for, and a sampled token (not text a
        stop string or the detokenizer released without one)."""
        return self.logprobs is not None and out.token_id is not None and out.logprob is not None

    @abc.abstractmethod
    def token(self, index: int, out: TokenOutput) -> dict[str, Any] | None:
        """The chunk of one streamed token, or None when it carries nothing to send."""

    @abc.abstractmethod
    def _text_chunk(self, index: int, text: str) -> dict[str, Any]:
        """The chunk carrying ``text`` for choice ``index`` (no logprobs, not finished)."""

    @abc.abstractmethod
    def finish(self, index: int, result: GenerationResult) -> dict[str, Any]:
        """The chunk that ends choice ``index``, which ``result`` finished."""

    def finish_event(self, index: int, result: GenerationResult) -> str:
        """The SSE text that ends choice ``index`` (with the ids of its tokens no chunk carried yet,
        the ending one's included, where token ids were asked for)."""
        if self._prompt_ids is not None:
            self._note(index, result.token_ids[self._noted.get(index, 0):])
        return self._finish_event(index, result)

    def _finish_event(self, index: int, result: GenerationResult) -> str:
        """:meth:`finish_event`'s text; a formatter that holds chunks back (echo with logprobs)
        sends them here."""
        return sse_event(self.finish(index, result))

    def token_event(self, index: int, out: TokenOutput) -> str | None:
        """The SSE event of one streamed token (None: nothing to send yet)."""
        if self._prompt_ids is not None and out.token_id is not None:
            self._note(index, (out.token_id,))
        return self._token_event(index, out)

    def _token_event(self, index: int, out: TokenOutput) -> str | None:
        """:meth:`token_event`'s text, byte for byte ``sse_event(self.token(index, out))``.

        The common case (text, no logprobs) splices the JSON-escaped text into the chunk's
        serialised envelope, built once per choice: at 16 streams this runs ~1000 times a second
        on the event loop's thread, which shares the cores with the model's threads.
        """
        if self.logprobs is not None or not out.text or self._prompt_ids is not None:
            chunk = self.token(index, out)
            return None if chunk is None else sse_event(chunk)
        parts = self._templates.get(index)
        if parts is None:
            marker = "\x00ruvllm-text\x00"
            before, _, after = sse_event(self._text_chunk(index, marker)).partition(encode_basestring(marker))
            parts = self._templates[index] = (before, after)
        return parts[0] + encode_basestring(out.text) + parts[1]


class ChatFormatter(_Base):
    """OpenAI's chat shapes of the lifecycle's events (:mod:`ruvllm.server.lifecycle.answer_events`):
    a choice's thinking as ``reasoning_content`` (vLLM's and llama-server's field) apart from
    ``content``; its tool calls, read out of the answer where ``plan`` expects them, as
    ``tool_calls`` (``index``, ``id``, ``type``, ``function.name``, ``function.arguments``, the
    arguments a JSON string) with ``finish_reason: "tool_calls"``, in the stream with the finish
    (a call is known whole only then); ``legacy_functions`` (the request used the deprecated
    functions API) answers the one call as ``function_call``, finishing ``"function_call"``."""

    object_name = "chat.completion"
    chunk_name = "chat.completion.chunk"

    def __init__(self, response_id: str, model: str, tokenizer: Tokenizer, logprobs: int | None, *,
                 reasoning: Reasoning | None = None, plan: ToolPlan | None = None, predicted: bool = False,
                 legacy_functions: bool = False):
        super().__init__(response_id, model, tokenizer, logprobs, predicted=predicted)
        self.reading = AnswerEvents.of(tokenizer, logprobs, reasoning, plan)
        self.legacy_functions = legacy_functions
        self._choices: dict[int, ChoiceEvents] = {}

    @classmethod
    def of(cls, run: ChatRun, model: str, *, legacy_functions: bool = False) -> ChatFormatter:
        """The formatter of a started chat ``run`` answering as ``model``."""
        reading = run.reading
        return cls(run.submission.id, model, reading.tokenizer, reading.logprobs, reasoning=reading.reasoning,
                   plan=reading.tools, predicted=run.predicted, legacy_functions=legacy_functions)

    def _choice(self, index: int) -> ChoiceEvents:
        choice = self._choices.get(index)
        if choice is None:
            choice = self._choices[index] = self.reading.choice()
        return choice

    def _name(self, token: TokenLogprob) -> str:
        return self._shown(token.token_id, token.text)

    def _logprobs(self, tokens: Sequence[TokenLogprobs]) -> dict[str, Any]:
        return {"content": [logprob_entry(t, self._name) for t in tokens]}

    def _reason(self, reason: str) -> str:
        return "function_call" if self.legacy_functions and reason == "tool_calls" else reason

    def _calls(self, calls: Sequence[ToolCall], *, streamed: bool) -> tuple[str, Any]:
        """The answer's calls as OpenAI returns them: ``tool_calls``, or the functions API's one
        ``function_call`` (a plan for it allows one call)."""
        if self.legacy_functions:
            return "function_call", _function(calls[0])
        return "tool_calls", [{**({"index": k} if streamed else {}), "id": c.id, "type": "function",
                               "function": _function(c)} for k, c in enumerate(calls)]

    def _chunk(self, index: int, delta: dict[str, Any], finish: str | None,
               logprobs: Any = None) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        if self._prompt_ids is not None:
            choice["token_ids"] = self._take_ids(index)
        return self._envelope(self.chunk_name, [choice])

    def _events_chunk(self, index: int, events: Sequence[Event]) -> dict[str, Any]:
        """One chunk of a step's events: a token's, or the last (with the calls and the finish)."""
        step = Step.of(events)
        delta = {"reasoning_content": step.thinking} if step.thinking else {}
        if step.text or not (step.thinking or step.finish):
            delta["content"] = step.text
        if step.calls:
            key, value = self._calls(step.calls, streamed=True)
            delta[key] = value
        return self._chunk(index, delta, self._reason(step.finish.reason) if step.finish else None,
                           self._logprobs(step.logprobs) if step.logprobs else None)

    def opening(self, index: int) -> dict[str, Any]:
        return self._with_prompt_ids(index, self._chunk(index, {"role": "assistant", "content": ""}, None))

    def _text_chunk(self, index: int, text: str) -> dict[str, Any]:
        return self._chunk(index, {"content": text}, None)

    def token(self, index: int, out: TokenOutput) -> dict[str, Any] | None:
        events = self._choice(index).token(out)
        return self._events_chunk(index, events) if events else None

    def _token_event(self, index: int, out: TokenOutput) -> str | None:
        if self.reading.reasoning is not None or self.reading.tools is not None:
            chunk = self.token(index, out)
            return None if chunk is None else sse_event(chunk)
        return super()._token_event(index, out)

    def finish(self, index: int, result: GenerationResult) -> dict[str, Any]:
        return self._events_chunk(index, self._choice(index).finish(result))

    def complete(self, outcomes, prompt_lengths) -> dict[str, Any]:
        choices = []
        for index, (outputs, result) in enumerate(outcomes):
            answer = self.reading.whole(outputs, result)
            message: dict[str, Any] = {"role": "assistant",
                                       "content": answer.text or (None if answer.calls else answer.text)}
            if answer.reasoning is not None:
                message["reasoning_content"] = answer.reasoning
            if answer.calls:
                key, value = self._calls(answer.calls, streamed=False)
                message[key] = value
            choices.append({"index": index, "message": message,
                            "logprobs": None if answer.logprobs is None else self._logprobs(answer.logprobs),
                            "finish_reason": self._reason(answer.finish.reason)})
        out = self._envelope(self.object_name, choices)
        results = [r for _, r in outcomes]
        out["usage"] = usage(sum(prompt_lengths), sum(r.usage.completion_tokens for r in results), results,
                             prompts=len(prompt_lengths), predicted=self.predicted)
        return out


def _function(call: ToolCall) -> dict[str, str]:
    """A call's ``function`` as OpenAI sends it: the arguments object encoded as JSON text."""
    return {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}


class CompletionFormatter(_Base):
    object_name = "text_completion"
    chunk_name = "text_completion"
    prompt_ids_per_choice = True

    def __init__(self, response_id: str, model: str, tokenizer: Tokenizer, logprobs: int | None,
                 echo: dict[int, str] | None = None):
        super().__init__(response_id, model, tokenizer, logprobs)
        self.echo = echo or {}
        self._offsets: dict[int, int] = {}

    def _legacy_lp(self, outputs: Sequence[TokenOutput], start: int) -> dict[str, Any]:
        tokens, token_lps, tops, offsets = [], [], [], []
        offset = start
        for o in outputs:
            if not self._reports_lp(o):
                offset += len(o.text)
                continue
            tokens.append(self._token_text(o))
            token_lps.append(o.logprob)
            alternatives = o.top_logprobs[: self.logprobs or 0]
            tops.append({self._shown(t.token_id, t.text): t.logprob for t in alternatives}
                        if self.logprobs else None)
            offsets.append(offset)
            offset += len(o.text)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops,
                "text_offset": offsets}

    def _chunk(self, index: int, text: str, finish: str | None, logprobs: Any = None) -> dict[str, Any]:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        if self._prompt_ids is not None:
            choice["token_ids"] = self._take_ids(index)
        return self._envelope(self.chunk_name, [choice])

    def opening(self, index: int) -> dict[str, Any] | None:
        echo = self.echo.get(index)
        self._offsets[index] = len(echo or "")
        if not echo and self._prompt_ids is None:
            return None
        return self._with_prompt_ids(index, self._chunk(index, echo or "", None))

    def _text_chunk(self, index: int, text: str) -> dict[str, Any]:
        return self._chunk(index, text, None)

    def token(self, index: int, out: TokenOutput) -> dict[str, Any] | None:
        has_lp = self._reports_lp(out)
        if not out.text and not has_lp:
            return None
        start = self._offsets.get(index, 0)
        self._offsets[index] = start + len(out.text)
        return self._chunk(index, out.text, None, self._legacy_lp([out], start) if has_lp else None)

    def finish(self, index: int, result: GenerationResult) -> dict[str, Any]:
        return self._chunk(index, "", result.finish_reason.value)

    def complete(self, outcomes, prompt_lengths) -> dict[str, Any]:
        choices = []
        for index, (outputs, result) in enumerate(outcomes):
            echo = self.echo.get(index, "")
            lp = self._legacy_lp(outputs, len(echo)) if self.logprobs is not None else None
            choices.append({"index": index, "text": echo + result.text, "logprobs": lp,
                            "finish_reason": result.finish_reason.value})
        out = self._envelope(self.object_name, choices)
        results = [r for _, r in outcomes]
        out["usage"] = usage(sum(prompt_lengths), sum(r.usage.completion_tokens for r in results), results,
                             prompts=len(prompt_lengths), predicted=self.predicted)
        return out
