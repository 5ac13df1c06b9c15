"""``ruvllm run-batch``: OpenAI's batch file format answered by the real command on the embedded model.

The answers are parsed with the official SDKs' own types, compared with what ``ruvllm serve``
answers the same body, and the file's order is checked against lines that finish out of order.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path

import anthropic.types
import openai
import openai.types
import openai.types.chat
import openai.types.responses
import pytest
from ruvllm.errors import BatchFileError
from ruvllm.server.batches.batch_file import parse_batch
from server_helpers import _require_backend, start_server

RUVLLM = Path(sys.executable).parent / "ruvllm"
SERVED = "gpt-4o-mini"


def line(custom_id: str, url: str, body: dict, **extra) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body, **extra})


def chat(content: str, max_tokens: int = 8, **extra) -> dict:
    return {"model": SERVED, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, **extra}


def run_batch(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(RUVLLM), "run-batch", "--backend", "llamacpp", *args], input=stdin,
                          capture_output=True, text=True, timeout=300)


def outputs(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines() if x.strip()]


# -- the file's shape, checked before anything loads ------------------------------------------

def test_every_problem_of_a_malformed_file_is_named_by_its_line():
    text = "\n".join([
        line("a", "/v1/chat/completions", {}),
        "not json",
        json.dumps({"custom_id": "b", "method": "GET", "url": "/v1/completions", "body": {}}),
        line("a", "/v1/completions", {}),
        line("c", "/v1/moderations", {}),
        line("d", "/v1/completions", {}, priority=1),
        json.dumps({"method": "POST", "url": "/v1/completions", "body": {}}),
        json.dumps({"custom_id": "e", "method": "POST", "url": "/v1/completions", "body": "hi"}),
    ])
    with pytest.raises(BatchFileError) as err:
        parse_batch(text)
    message = str(err.value)
    assert "nothing was run" in message
    for expected in ("line 2 is not JSON", "line 3 method must be \"POST\", got 'GET'",
                     "line 4 repeats custom_id 'a' of line 1", "line 5 url '/v1/moderations' is not one of",
                     "line 6 has unknown key 'priority'", "line 7 needs custom_id",
                     "line 8 needs body"):
        assert expected in message
    assert "line 1 " not in message


def test_a_long_list_of_problems_is_cut_and_counted():
    with pytest.raises(BatchFileError, match=r"line 10 is not JSON .*; and 5 more$"):
        parse_batch("\n".join(["{"] * 15))


def test_blank_lines_are_skipped_and_an_empty_file_is_refused():
    lines = parse_batch("\n" + line("a", "/v1/embeddings", {"input": "x"}) + "\n\n")
    assert [(x.number, x.custom_id, x.url) for x in lines] == [(2, "a", "/v1/embeddings")]
    with pytest.raises(BatchFileError, match="has no requests"):
        parse_batch("\n \n")


def test_a_malformed_file_fails_before_the_model_loads(tmp_path: Path):
    src = tmp_path / "in.jsonl"
    src.write_text(line("a", "/v1/chat/completions", {}) + "\n" + line("a", "/v1/chat/completions", {}))
    proc = run_batch("-i", str(src), "-o", str(tmp_path / "out.jsonl"))
    assert proc.returncode == 1
    assert "line 2 repeats custom_id 'a' of line 1" in proc.stderr
    assert "Traceback" not in proc.stderr and "serving" not in proc.stderr  # nothing loaded
    assert not (tmp_path / "out.jsonl").exists()
    proc = run_batch("-i", str(src.with_name("missing.jsonl")), "-o", "-")
    assert proc.returncode == 1 and "does not exist" in proc.stderr
    src.write_text(line("a", "/v1/chat/completions", {}))
    proc = run_batch("-i", str(src), "-o", str(tmp_path / "no" / "out.jsonl"))
    assert proc.returncode == 1 and "is not a directory" in proc.stderr


# -- answers ------------------------------------------------------------------------------------

def test_each_route_answers_in_its_own_shape_and_refusals_keep_their_status(tmp_path: Path):
    _require_backend()
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([
        line("chat", "/v1/chat/completions", chat("Say hi")),
        line("completion", "/v1/completions", {"model": SERVED, "prompt": "The capital of France is",
                                              "max_tokens": 4, "temperature": 0}),
        "",
        line("embedding", "/v1/embeddings", {"model": SERVED, "input": "hello"}),
        line("response", "/v1/responses", {"model": SERVED, "input": "Say hi", "max_output_tokens": 16}),
        line("message", "/v1/messages", {"model": SERVED, "max_tokens": 4,
                                         "messages": [{"role": "user", "content": "Hi"}]}),
        line("bad", "/v1/chat/completions", chat("x", max_tokens=-1)),
        line("stream", "/v1/chat/completions", chat("x", stream=True)),
        line("other-model", "/v1/messages", {"model": "claude-x", "max_tokens": 4,
                                             "messages": [{"role": "user", "content": "Hi"}]}),
    ]) + "\n")
    out = tmp_path / "out.jsonl"
    proc = run_batch("-i", str(src), "-o", str(out), "--served-model-name", SERVED)
    assert proc.returncode == 0, proc.stderr
    assert "8 requests" in proc.stderr and "5 answered, 3 refused or failed" in proc.stderr
    results = {r["custom_id"]: r for r in outputs(out.read_text())}
    assert list(results) == ["chat", "completion", "embedding", "response", "message", "bad", "stream",
                             "other-model"]
    assert all(r["id"].startswith("batch_req_") for r in results.values())
    assert all(r["error"] is None for r in results.values())
    status = {k: r["response"]["status_code"] for k, r in results.items()}
    assert status == {"chat": 200, "completion": 200, "embedding": 200, "response": 200, "message": 200,
                      "bad": 400, "stream": 400, "other-model": 404}
    body = {k: r["response"]["body"] for k, r in results.items()}
    answer = openai.types.chat.ChatCompletion.model_validate(body["chat"])
    assert answer.model == SERVED and answer.choices[0].message.content
    assert results["chat"]["response"]["request_id"] == answer.id
    assert openai.types.Completion.model_validate(body["completion"]).choices[0].text
    assert len(openai.types.CreateEmbeddingResponse.model_validate(body["embedding"]).data[0].embedding) > 100
    assert openai.types.responses.Response.model_validate(body["response"]).output_text
    assert anthropic.types.Message.model_validate(body["message"]).content[0].text
    assert body["bad"]["error"]["param"] == "max_tokens"
    assert body["stream"]["error"]["param"] == "stream"
    assert body["other-model"]["type"] == "error"  # Anthropic's error shape on its route
    assert "claude-x" in body["other-model"]["error"]["message"]


def test_the_output_keeps_the_input_order_when_lines_finish_out_of_order(tmp_path: Path):
    _require_backend()
    # The first line writes 48 tokens, the others 1: they finish first, the file still starts with it.
    lines = [line("long", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 48,
                                               "temperature": 0, "ignore_eos": True})]
    lines += [line(f"short-{i}", "/v1/completions", {"prompt": f"Number {i}:", "max_tokens": 1})
              for i in range(6)]
    proc = run_batch("-i", "-", "-o", "-", "--quiet", stdin="\n".join(lines))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("ruvllm:") == 0  # --quiet
    results = outputs(proc.stdout)
    assert [r["custom_id"] for r in results] == ["long"] + [f"short-{i}" for i in range(6)]
    assert results[0]["response"]["body"]["usage"]["completion_tokens"] == 48


def test_a_line_answers_what_the_server_answers_the_same_body(tmp_path: Path):
    _require_backend()
    body = chat("Name a colour.", max_tokens=24)
    server = start_server(api_key=None)
    try:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused")
        served = client.chat.completions.create(**{**body, "model": server.engine.info.name})
    finally:
        server.stop()  # its lifespan shuts the engine down
    src = tmp_path / "in.jsonl"
    src.write_text(line("one", "/v1/chat/completions", {**body, "model": server.engine.info.name}))
    proc = run_batch("-i", str(src), "-o", "-", "--quiet")
    assert proc.returncode == 0, proc.stderr
    (result,) = outputs(proc.stdout)
    batched = openai.types.chat.ChatCompletion.model_validate(result["response"]["body"])
    # Both requests ran alone on an idle engine: llama.cpp computes them bit for bit alike.
    assert batched.choices[0].message.content == served.choices[0].message.content
    assert batched.usage.completion_tokens == served.usage.completion_tokens


class _Store(http.server.BaseHTTPRequestHandler):
    """GET serves ``files``; PUT stores into it (or answers ``fail_put``)."""

    files: dict[str, bytes] = {}
    fail_put: int | None = None

    def do_GET(self):
        data = self.files.get(self.path)
        self.send_response(200 if data is not None else 404)
        self.end_headers()
        self.wfile.write(data or b"")

    def do_PUT(self):
        data = self.rfile.read(int(self.headers["content-length"]))
        if self.fail_put:
            self.send_response(self.fail_put)
        else:
            self.files[self.path] = data
            self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def store():
    _Store.files, _Store.fail_put = {}, None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Store)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Store
    server.shutdown()


def test_input_and_output_at_urls_and_a_failed_upload_keeps_the_results(store):
    _require_backend()
    url, handler = store
    handler.files["/in.jsonl"] = (line("a", "/v1/completions", {"prompt": "Hello", "max_tokens": 2}) + "\n"
                                  + line("b", "/v1/embeddings", {"input": "Hello"})).encode()
    proc = run_batch("-i", f"{url}/in.jsonl", "-o", f"{url}/out.jsonl", "--quiet")
    assert proc.returncode == 0, proc.stderr
    results = outputs(handler.files["/out.jsonl"].decode())
    assert [(r["custom_id"], r["response"]["status_code"]) for r in results] == [("a", 200), ("b", 200)]

    handler.fail_put = 500
    proc = run_batch("-i", f"{url}/in.jsonl", "-o", f"{url}/lost.jsonl", "--quiet")
    assert proc.returncode == 1
    assert "uploading its output" in proc.stderr and "the output is in " in proc.stderr
    kept = Path(proc.stderr.split("the output is in ")[1].split()[0])
    try:
        assert [r["custom_id"] for r in outputs(kept.read_text())] == ["a", "b"]
    finally:
        kept.unlink()
    proc = run_batch("-i", f"{url}/missing.jsonl", "-o", "-")
    assert proc.returncode == 1 and "cannot read the batch input" in proc.stderr and "404" in proc.stderr
