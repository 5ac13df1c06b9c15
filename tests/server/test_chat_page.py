"""The chat page in a real browser (Debian's headless chromium, driven by Selenium) against a real
server on the embedded model: it loads, streams an answer token by token, stops one mid-stream,
shows markup in an answer as text, and asks for the API key when the server has one."""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from browser_helpers import (
    add_to_chat_requests,
    ask,
    chromium_driver,
    console_errors,
    finished_answer,
    last_answer,
    open_page,
    set_field,
    wait_for,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from server_helpers import API_KEY, RunningServer, start_server

#: The picture in docs/server.md, rewritten only when asked (``RUVLLM_UPDATE_SCREENSHOTS=1``): a
#: test that rewrote it on every run left every checkout with a changed file.
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "chat_page.png"
#: Markup a model's answer may contain; none of it may become an element or run.
MARKUP = '<script>window.pwned = 1</script><img src="x" onerror="window.pwned = 2">'


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = start_server(api_key=None, server={"max_tokens_limit": 512})
    yield running
    running.stop()


@pytest.fixture(scope="module")
def keyed_server() -> Iterator[RunningServer]:
    running = start_server(api_key=API_KEY)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def driver():
    with chromium_driver() as browser:
        yield browser


def cancelled_requests(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('ruvllm:request_success_total{') and 'finished_reason="cancelled"' in line)


def test_root_is_the_page_for_a_browser_and_ollamas_probe_for_its_client(server: RunningServer):
    page = httpx.get(server.url + "/", headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/ui/app.js"></script>' in page.text
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy and "default-src 'none'" in policy
    for probe in (httpx.get(server.url + "/"), httpx.get(server.url + "/", headers={"Accept": "*/*"})):
        assert probe.text == "Ollama is running"
    assert httpx.head(server.url + "/").status_code == 200
    assert httpx.get(server.url + "/ui").text == page.text
    script = httpx.get(server.url + "/ui/app.js")
    assert script.headers["content-type"].startswith("text/javascript")


def test_page_loads_and_shows_the_server(driver, server: RunningServer):
    open_page(driver, server.url + "/")
    model = server.engine.info.name
    assert driver.find_element(By.ID, "model-single").text == model
    # One model: no picker; the page asks /v1/models, as a client would.
    assert not driver.find_element(By.ID, "model-picker").is_displayed()
    wait_for(lambda: driver.find_element(By.ID, "status-backend").text.startswith("llamacpp"),
             "the status panel to show the backend")
    assert driver.find_element(By.ID, "status-kv").text.endswith("%)")
    # "1 core" where the test worker is pinned to one CPU (make test's -n 2), "2 cores" elsewhere.
    assert re.search(r"\b\d+ cores?\b", driver.find_element(By.ID, "status-cpu").text)
    assert driver.find_element(By.ID, "status-feedback").text.startswith("off")
    assert console_errors(driver) == []


def test_answer_streams_token_by_token(driver, server: RunningServer, tmp_path):
    open_page(driver, server.url + "/")
    set_field(driver, "max-tokens", "96")
    set_field(driver, "temperature", "0")
    set_field(driver, "system", "You are a helpful programming assistant.")
    add_to_chat_requests(driver, {"min_tokens": 96})
    ask(driver, "Write a Python function that reverses a string.")
    seen: list[str] = []
    while (answer := last_answer(driver)) is None or answer[0] == "streaming":
        if answer is not None and (not seen or answer[1] != seen[-1]):
            seen.append(answer[1])
        time.sleep(0.01)
    state, text = answer
    assert state == "done", text
    # The text grew piece by piece while the answer streamed (a Markdown mark that has just come,
    # such as a code fence, may hide its characters until its block is known, so the text shown
    # is not always a prefix of the next).
    growing = [t for t in seen if t]
    longer = sum(len(b) > len(a) for a, b in itertools.pairwise(growing))
    assert longer >= 5 and len(growing[0]) < len(text) / 2, growing
    assert driver.find_element(By.ID, "status-speed").text.startswith("96 tokens, ")
    assert driver.find_element(By.ID, "status-ttft").text.endswith(" ms")
    # SONA is not attached: no good/bad marks.
    assert driver.find_elements(By.CSS_SELECTOR, "#messages .thumb") == []
    # A few metrics polls draw the plot, then the picture for docs/server.md.
    time.sleep(5)
    shot = SCREENSHOT if os.environ.get("RUVLLM_UPDATE_SCREENSHOTS") == "1" else tmp_path / SCREENSHOT.name
    assert driver.save_screenshot(str(shot)) and shot.read_bytes().startswith(b"\x89PNG")
    assert console_errors(driver) == []
    # The conversation is kept in the browser: a reload shows it again.
    driver.refresh()
    wait_for(lambda: last_answer(driver) == ("done", text), "the stored conversation after a reload")


def test_stop_ends_the_answer_mid_stream(driver, server: RunningServer):
    open_page(driver, server.url + "/")
    before = cancelled_requests(server.url)
    set_field(driver, "max-tokens", "400")
    add_to_chat_requests(driver, {"min_tokens": 400})
    ask(driver, "Count from one to one thousand in words.")
    wait_for(lambda: (a := last_answer(driver)) and len(a[1]) > 20, "the first tokens")
    driver.find_element(By.ID, "stop").click()
    state, text = wait_for(lambda: (a := last_answer(driver)) and a[0] != "streaming" and a, "the stop")
    assert state == "stopped"
    time.sleep(1.5)
    assert last_answer(driver) == ("stopped", text)
    assert driver.find_element(By.ID, "send").is_enabled()
    # The server saw the connection close and cancelled the request (its KV freed).
    wait_for(lambda: cancelled_requests(server.url) == before + 1, "the server to count a cancelled request")
    # Regenerate replaces the stopped answer with a new one.
    add_to_chat_requests(driver, {"max_tokens": 8, "min_tokens": 8})
    driver.find_element(By.ID, "regenerate").click()
    assert finished_answer(driver)[0] == "done"
    assert len(driver.find_elements(By.CSS_SELECTOR, "#messages .message.assistant")) == 1


def test_markup_the_model_writes_is_shown_as_text(driver, server: RunningServer):
    open_page(driver, server.url + "/")
    # The model's output is forced to the markup by a regex the server enforces while sampling.
    regex = MARKUP.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
    add_to_chat_requests(driver, {"structured_outputs": {"regex": regex}})
    set_field(driver, "max-tokens", "96")
    ask(driver, "Show me an HTML snippet.")
    state, text = finished_answer(driver)
    assert (state, text) == ("done", MARKUP)
    assert driver.find_elements(By.CSS_SELECTOR, "#messages script, #messages img") == []
    assert driver.execute_script("return window.pwned") is None


def test_the_policy_stops_an_inline_script_that_got_into_the_page(driver, server: RunningServer):
    """Defence in depth: were a bug ever to put markup from an answer into the DOM, the page's
    Content-Security-Policy still refuses to run an inline script or handler."""
    open_page(driver, server.url + "/")
    console_errors(driver)
    driver.execute_script("""
        const script = document.createElement("script");
        script.textContent = "window.pwned = 1";
        document.body.append(script);
        const img = document.createElement("img");
        img.setAttribute("onerror", "window.pwned = 2");
        img.src = "/no-such-image";
        document.body.append(img);
    """)
    time.sleep(0.5)
    assert driver.execute_script("return window.pwned") is None
    assert any("Content Security Policy" in e for e in console_errors(driver))


def test_stored_answer_is_rendered_as_markdown_never_as_html(driver, server: RunningServer):
    open_page(driver, server.url + "/")
    answer = (f"## Steps\n\n**Bold** and `code`, then {MARKUP} and [a link](javascript:alert(3)), "
              "[the docs](https://example.org/docs).\n\n- first\n- second\n\n"
              "```html\n<b onmouseover=\"window.pwned = 4\">x</b>\n```")
    conversation = {"id": "c1", "title": "markup", "created": 0, "messages": [
        {"role": "user", "content": "<i>hi</i>"},
        # Saved while it streamed: the page that saved it closed before the answer ended.
        {"role": "assistant", "content": answer, "state": "streaming"}]}
    driver.execute_script("localStorage.setItem('ruvllm-chat/conversations', arguments[0]);"
                          "localStorage.setItem('ruvllm-chat/current', 'c1');", json.dumps([conversation]))
    driver.refresh()
    wait_for(lambda: last_answer(driver), "the stored conversation")
    assert last_answer(driver)[0] == "stopped"
    messages = driver.find_element(By.ID, "messages")
    assert messages.find_element(By.CSS_SELECTOR, ".assistant h4").text == "Steps"
    assert messages.find_element(By.CSS_SELECTOR, ".assistant strong").text == "Bold"
    assert messages.find_element(By.CSS_SELECTOR, ".assistant p code").text == "code"
    items = messages.find_elements(By.CSS_SELECTOR, ".assistant ul li")
    assert [li.text for li in items] == ["first", "second"]
    assert messages.find_element(By.CSS_SELECTOR, ".assistant pre code").text == \
        '<b onmouseover="window.pwned = 4">x</b>'
    assert MARKUP in messages.find_element(By.CSS_SELECTOR, ".assistant p").text
    assert "[a link](javascript:alert(3))" in messages.find_element(By.CSS_SELECTOR, ".assistant p").text
    # Only a web link becomes a link, opened apart from the page.
    links = messages.find_elements(By.CSS_SELECTOR, "a")
    assert [(a.text, a.get_attribute("href"), a.get_attribute("rel")) for a in links] == \
        [("the docs", "https://example.org/docs", "noopener noreferrer")]
    assert messages.find_element(By.CSS_SELECTOR, ".user .content").text == "<i>hi</i>"
    assert messages.find_elements(By.CSS_SELECTOR, "script, img, b, i") == []
    assert driver.execute_script("return window.pwned") is None
    assert console_errors(driver) == []
    # Conversations are listed; a new one starts empty, and deleting it goes back to the other.
    driver.find_element(By.ID, "new-chat").click()
    assert len(driver.find_elements(By.CSS_SELECTOR, "#conversation-list li")) == 2
    assert driver.find_elements(By.CSS_SELECTOR, "#messages .message") == []
    driver.find_element(By.CSS_SELECTOR, "#conversation-list li.active .delete").click()
    listed = driver.find_elements(By.CSS_SELECTOR, "#conversation-list li .open")
    assert [li.text for li in listed] == ["markup"]
    assert last_answer(driver) is not None


def test_a_refused_request_shows_the_servers_reason(driver, server: RunningServer):
    open_page(driver, server.url + "/")
    set_field(driver, "max-tokens", "100000")  # over this server's max_tokens_limit (512)
    set_field(driver, "prompt", "Hello")
    driver.find_element(By.ID, "prompt").send_keys(Keys.ENTER)  # Enter sends
    state, _ = finished_answer(driver)
    assert state == "error"
    assert "max_tokens" in driver.find_element(By.CSS_SELECTOR, "#messages .assistant .note.error").text
    assert driver.find_element(By.ID, "regenerate").is_enabled()


def test_the_page_needs_the_api_key_when_the_server_has_one(driver, keyed_server: RunningServer):
    open_page(driver, keyed_server.url + "/", connected=False)
    dialog = driver.find_element(By.ID, "key-dialog")
    wait_for(dialog.is_displayed, "the key dialog")
    model = keyed_server.engine.info.name
    # Nothing the server knows is on the page: not the model, not the backend.
    page = driver.execute_script("return document.documentElement.outerHTML")
    assert model not in page and "llamacpp" not in page
    set_field(driver, "api-key", "wrong-key")
    driver.find_element(By.ID, "key-submit").click()
    wait_for(lambda: driver.find_element(By.ID, "key-error").is_displayed(), "the refusal")
    assert "refused" in driver.find_element(By.ID, "key-error").text
    set_field(driver, "api-key", API_KEY)
    driver.find_element(By.ID, "key-submit").click()
    wait_for(lambda: driver.find_element(By.ID, "model-single").text == model, "the models, with the key")
    wait_for(lambda: driver.find_element(By.ID, "status-backend").text.startswith("llamacpp"), "the backend")
    assert not dialog.is_displayed()
    # The page's own files are public; without the key the API still refuses.
    assert httpx.get(keyed_server.url + "/ui/app.js").status_code == 200
    assert httpx.get(keyed_server.url + "/v1/models").status_code == 401
