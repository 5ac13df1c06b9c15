"""OpenAI's Predicted Outputs through the official ``openai`` client on a server with no
``speculative_method``: a chat request's ``prediction`` drafts its answer, and usage reports the
prediction's tokens as OpenAI does (``completion_tokens_details``). That the answer is what it
would be without a prediction is proven on the engine (tests/engine/test_prediction.py, exact on
fakes; tests/llamacpp/test_llamacpp_speculative.py, up to near-ties on llama.cpp).

The server drafts at a fixed length (``speculative_adaptive = false``): by default the length
follows the step times the engine measures, and with the CPUs shared (the other test worker,
three busy loops: measured) one more token looked as dear as a step, so nothing was drafted and
these tests failed on a timing, not on the feature. benchmarks/predicted_outputs.py measures the
default's gain."""

from __future__ import annotations

import openai
import pytest
from ruvllm.testing.speculative import COPY_PROMPT
from server_helpers import API_KEY, start_server


@pytest.fixture(scope="module")
def client():
    running = start_server(engine_options={"speculative_adaptive": False})
    yield openai.OpenAI(base_url=running.base_url, api_key=API_KEY, max_retries=0, timeout=60)
    running.stop()


@pytest.fixture(scope="module")
def model_name(client) -> str:
    return client.models.list().data[0].id


def test_a_prediction_is_drafted_and_reported_in_usage(client, model_name):
    ask = dict(model=model_name, messages=[{"role": "user", "content": COPY_PROMPT}], temperature=0,
               max_tokens=32)
    plain = client.chat.completions.create(**ask)
    assert plain.usage.completion_tokens_details is None  # no prediction, nothing to report
    answer = plain.choices[0].message.content
    as_parts = {"type": "content", "content": [{"type": "text", "text": answer[:20]},
                                               {"type": "text", "text": answer[20:]}]}
    for prediction in ({"type": "content", "content": answer}, as_parts):
        predicted = client.chat.completions.create(**ask, prediction=prediction)
        details = predicted.usage.completion_tokens_details
        assert details.accepted_prediction_tokens > 8, predicted.usage
        assert details.rejected_prediction_tokens >= 0
        assert details.accepted_prediction_tokens < predicted.usage.completion_tokens
        assert predicted.choices[0].message.content


def test_streamed_usage_reports_the_prediction_too(client, model_name):
    stream = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": COPY_PROMPT}], temperature=0, max_tokens=24,
        prediction={"type": "content", "content": COPY_PROMPT.split("Text: ")[1]},
        stream=True, stream_options={"include_usage": True})
    usage = list(stream)[-1].usage
    assert usage.completion_tokens_details.accepted_prediction_tokens > 0, usage


@pytest.mark.parametrize("prediction, param", [
    ({"type": "file", "content": "x"}, "prediction.type"),
    ({"type": "content", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
     "prediction.content[0]"),
])
def test_a_prediction_that_is_not_text_is_a_400_naming_it(client, model_name, prediction, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=2, prediction=prediction)
    assert err.value.body["param"] == param, err.value.body
