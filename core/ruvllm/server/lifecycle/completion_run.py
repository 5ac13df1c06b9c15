"""One text completion from its prompts to a running submission: the part the completion surfaces
share, beside :func:`ruvllm.server.lifecycle.chat_run.start_chat`.

OpenAI's ``/v1/completions``, Ollama's ``/api/generate`` and llama-server's ``/completion`` and
``/infill`` differ in how they build the prompt (token ids, a fill-in-the-middle prompt, a chat
turn), in the rules they add to the parameters and in how they write the answer, not in
what happens between: each translates its body into a neutral
:class:`~ruvllm.server.lifecycle.request_input.RequestInput` and its prompts into token ids, and
here each prompt's parameters are checked against the server's limits and the model's context,
``bad_words`` tokenized, the grammar compiled, and ``n`` choices
per prompt submitted at once through the
:class:`~ruvllm.server.lifecycle.completion_service.CompletionService`. That part is here, once.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ruvllm.guided.request import processors as guided_processors
from ruvllm.server.lifecycle.completion_service import ChoiceRequest, CompletionService, Submission
from ruvllm.server.lifecycle.model_pool import Route
from ruvllm.server.lifecycle.params import Limits, seeded
from ruvllm.server.lifecycle.request_input import RequestInput
from ruvllm.server.lifecycle.scheduling import submit_options
from ruvllm.types import GenerationParams

#: What a surface makes of a prompt's parameters beyond the neutral request's fields.
Adjust = Callable[[GenerationParams], GenerationParams]


@attrs.frozen
class CompletionRun:
    submission: Submission
    #: Each prompt's token ids.
    prompts: list[list[int]]
    #: The prompt each choice answers, by choice index: ``n`` choices per prompt, prompt after prompt.
    prompt_of: list[int]
    #: The choices as submitted, by choice index (their parameters are what the answer reports).
    choices: list[ChoiceRequest]
    #: Tokens one request may use on the route: the model's context, capped by ``--max-context``.
    context_length: int

    def choice_prompts(self) -> dict[int, list[int]]:
        """Each choice's prompt ids, by choice index."""
        return {i: self.prompts[p] for i, p in enumerate(self.prompt_of)}


async def start_completion(route: Route, request: RequestInput, prompts: list[list[int]], limits: Limits, *,
                           id_prefix: str, adjust: Adjust | None = None) -> CompletionRun:
    """Check ``request`` for each of ``prompts`` (its token ids), submit ``request.n`` choices per
    prompt on ``route`` and return them running (a refusal raises before anything runs).
    ``adjust``: what a surface makes of each prompt's parameters beyond the neutral request's
    fields (Ollama's logprobs, llama.cpp's rules: penalty window, Mirostat, ``n_predict: 0``)."""
    service = CompletionService(route, limits)
    engine = route.engine
    banned = await service.bad_word_sequences(request.sampling.bad_words)
    params = [attrs.evolve(service.choice_params(request, ids), banned_sequences=banned) for ids in prompts]
    if adjust is not None:
        params = [adjust(p) for p in params]
    n = request.n
    prompt_of = [p for p in range(len(prompts)) for _ in range(n)]
    procs = await guided_processors(engine, request.grammar, len(prompt_of))
    choices = [ChoiceRequest(index=i, prompt_ids=prompts[p], params=seeded(params[p], i % n),
                             processors=procs[i]) for i, p in enumerate(prompt_of)]
    submission = await service.submit(choices, id_prefix=id_prefix,
                                      **submit_options(request.priority, request.cache_salt, engine))
    return CompletionRun(submission=submission, prompts=prompts, prompt_of=prompt_of, choices=choices,
                         context_length=service.context_length)
