"""A chat choice's outputs as the neutral events every surface renders (lifecycle/answer_events.py).

No model and no HTTP: outputs are fed by hand, as the engine streams them, and the events are
checked for what every surface relies on: tool call arguments stay the object the model wrote,
held tool-call text sends its tokens' logprobs with the next thing sent, thinking is told from
the answer, and a stream adds up to the whole answer of the same outputs.
"""

from __future__ import annotations

from ruvllm.guided.tools import ToolCall, plan_tools
from ruvllm.reasoning import Reasoning
from ruvllm.server.lifecycle.answer_events import AnswerEvents
from ruvllm.server.lifecycle.events import Finish, Logprobs, ReasoningDelta, Step, TextDelta
from ruvllm.types import FinishReason, GenerationResult, Timings, TokenLogprob, TokenOutput, Usage

ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}
HERMES_TEMPLATE = "{% if tools %}<tools>{{ tools | tojson }}</tools> use <tool_call>{% endif %}..."
PIECES = ["<think>", "sum", "</think>", "Sure", ". ", "<tool", "_call>", '{"name": "add", ',
          '"arguments": {"a": 1, "b": 2}}', "</tool_call>"]


class _Tok:
    def token_text(self, token_id: int) -> str:
        return f"<{token_id}>"


def _outputs() -> list[TokenOutput]:
    return [TokenOutput(index=k, token_id=k, text=p, logprob=-0.5, top_logprobs=(TokenLogprob(k, p, -0.5),))
            for k, p in enumerate(PIECES)]


def _result() -> GenerationResult:
    return GenerationResult(text="".join(PIECES), token_ids=tuple(range(len(PIECES))),
                            finish_reason=FinishReason.STOP, timings=Timings(),
                            usage=Usage(prompt_tokens=3, completion_tokens=len(PIECES)))


def _reading(logprobs: int | None = 1) -> AnswerEvents:
    return AnswerEvents.of(_Tok(), logprobs, Reasoning(), plan_tools([ADD], "auto", None, HERMES_TEMPLATE))


def _streamed(reading: AnswerEvents) -> list[list]:
    choice = reading.choice()
    return [choice.of(out) for out in _outputs()] + [choice.of(_result())]


def test_a_tool_call_keeps_the_arguments_the_model_wrote_as_an_object():
    steps = _streamed(_reading())
    calls = [e for step in steps for e in step if isinstance(e, ToolCall)]
    assert [(c.name, c.arguments) for c in calls] == [("add", {"a": 1, "b": 2})]
    finish = steps[-1][-1]
    assert isinstance(finish, Finish) and finish.reason == "tool_calls"
    assert finish.result.usage.prompt_tokens == 3


def test_thinking_text_and_calls_are_told_apart_and_add_up_to_the_whole_answer():
    reading = _reading()
    steps = _streamed(reading)
    said = [Step.of(step) for step in steps]
    whole = reading.whole(_outputs(), _result())
    assert "".join(s.thinking for s in said) == whole.reasoning == "sum"
    assert "".join(s.text for s in said) == whole.text == "Sure."
    assert [c.arguments for s in said for c in s.calls] == [c.arguments for c in whole.calls]
    assert [t for s in said for t in s.logprobs] == list(whole.logprobs or ())
    assert whole.finish.reason == "tool_calls"


def test_held_tool_call_text_sends_its_logprobs_first_with_what_goes_out_next():
    steps = _streamed(_reading())
    for step in steps:
        if any(isinstance(e, Logprobs) for e in step):
            assert isinstance(step[0], Logprobs), step  # before the text a surface sends them with
    # The call's tokens say nothing while held: their entries wait for the finish.
    call_text = ("<tool", "_call", '{"', '"a')
    held = [step for step, piece in zip(steps, PIECES, strict=False) if piece.startswith(call_text)]
    assert held and all(step == [] for step in held)
    last = Step.of(steps[-1])
    assert [t.token.text for t in last.logprobs] == [f"<{k}>" for k in range(5, len(PIECES))]


def test_without_logprobs_or_tools_a_token_is_its_text():
    choice = AnswerEvents(_Tok()).choice()
    assert choice.of(TokenOutput(index=0, token_id=1, text="Hi")) == [TextDelta("Hi")]
    assert choice.of(TokenOutput(index=1, token_id=2, text="")) == []
    assert [type(e) for e in choice.of(_result())] == [Finish]
    thinking = AnswerEvents(_Tok(), reasoning=Reasoning(opened=True)).choice()
    assert thinking.of(TokenOutput(index=0, token_id=1, text="hmm")) == [ReasoningDelta("hmm")]
