"""``ruvllm chat`` driven in a real pseudo-terminal, as a person would use it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from ruvllm.plugins import get_registry

pexpect = pytest.importorskip("pexpect")


@pytest.fixture
def chat_session():
    if "llamacpp" not in get_registry().backends:
        pytest.skip("the llamacpp backend is not installed")
    ruvllm = str(Path(sys.executable).parent / "ruvllm")
    child = pexpect.spawn(ruvllm, ["chat", "--backend", "llamacpp", "--max-tokens", "6"],
                          env={**os.environ, "TERM": "dumb", "NO_COLOR": "1"},
                          encoding="utf-8", timeout=90, dimensions=(40, 200))
    yield child
    if child.isalive():
        child.terminate(force=True)


def test_chat_repl_commands_and_streaming(chat_session):
    child = chat_session
    child.expect("chatting with .* on llamacpp")
    child.expect_exact("you> ")
    child.sendline("/help")
    child.expect_exact("/system [TEXT]")
    child.expect_exact("you> ")

    child.sendline("Say hello.")
    # The reply streams, then a stats line with real token counts.
    child.expect(r"\[(\d+) tokens, [\d.]+ tok/s, (stop|length)\]")
    assert 1 <= int(child.match.group(1)) <= 6
    child.expect_exact("you> ")

    child.sendline("/temp 0.5")
    child.expect_exact("temperature = 0.5")
    child.sendline("/temp hot")
    child.expect_exact("error: /temp needs a number")
    child.sendline("/max 3")
    child.expect_exact("max tokens = 3")
    child.sendline("/system You are terse.")
    child.expect_exact("system prompt set: You are terse.")
    child.sendline("/history")
    child.expect_exact("[system] You are terse.")
    child.sendline("Hi")
    child.expect(r"\[(\d+) tokens")
    assert int(child.match.group(1)) <= 3
    child.sendline("/history")
    child.expect_exact("[user] Hi")
    child.expect_exact("[assistant]")
    child.sendline("/clear")
    child.expect_exact("history cleared")
    child.sendline("/bogus")
    child.expect_exact("unknown command /bogus")
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_chat_exits_cleanly_on_ctrl_d(chat_session):
    child = chat_session
    child.expect_exact("you> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert "Traceback" not in (child.before or "")
