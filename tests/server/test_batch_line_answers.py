"""A batch line's answer is kept in no API's shape (lifecycle/batch_lane.py's ``LineAnswer``, issue 62)
and each batch surface writes it in its own: OpenAI's output line (batches/batch_file.py) and
Anthropic's result (anthropic/message_batches_api.py), including the line that got no answer at all.
"""

from __future__ import annotations

import datetime

from ruvllm.server.anthropic.message_batches_api import MessageBatch
from ruvllm.server.batches.batch_file import output_line
from ruvllm.server.lifecycle.batch_lane import BatchLine, LineAnswer

ANSWERED = LineAnswer("a", 200, {"id": "chatcmpl-1", "choices": []})
REFUSED = LineAnswer("b", 400, {"error": {"message": "max_tokens: too many"}})
LOST = LineAnswer("c", None, failure="ConnectError: gone")


def test_which_lines_succeeded():
    assert [x.succeeded for x in (ANSWERED, REFUSED, LOST)] == [True, False, False]


def test_openai_writes_its_output_line():
    line = output_line(ANSWERED)
    assert line["id"].startswith("batch_req_") and line["custom_id"] == "a" and line["error"] is None
    assert line["response"] == {"status_code": 200, "request_id": "chatcmpl-1", "body": ANSWERED.body}
    assert output_line(REFUSED)["response"]["request_id"].startswith("req_")  # the body has no id
    lost = output_line(LOST)
    assert lost["response"] is None
    assert lost["error"] == {"code": "batch_request_failed", "message": "ConnectError: gone"}


def test_anthropic_writes_its_results():
    lines = [BatchLine(k + 1, cid, "/v1/messages", {}) for k, cid in enumerate("abcd")]
    batch = MessageBatch(id="msgbatch_1", lines=lines, created_at=datetime.datetime.now(datetime.UTC),
                         results={0: ANSWERED, 1: REFUSED, 2: LOST})
    assert [batch.result(i) for i in range(4)] == [
        {"custom_id": "a", "result": {"type": "succeeded", "message": ANSWERED.body}},
        {"custom_id": "b", "result": {"type": "errored", "error": REFUSED.body}},
        {"custom_id": "c", "result": {"type": "errored", "error": {"type": "error", "error": {
            "type": "api_error", "message": "ConnectError: gone"}}}},
        {"custom_id": "d", "result": {"type": "canceled"}}]
