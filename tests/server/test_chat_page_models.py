"""The chat page on servers set up otherwise than the plain one: its model picker with two
models, its good/bad marks with SONA attached, the speculative figures when the engine drafts,
a thinking model's reasoning, and a server that stops answering. In Debian's headless chromium
(Selenium), against real servers."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from browser_helpers import (
    add_to_chat_requests,
    ask,
    chromium_driver,
    console_errors,
    finished_answer,
    open_page,
    set_field,
    wait_for,
)
from ruvllm.config import load_config
from ruvllm.server.app import create_app
from ruvllm.server.runner import build_pool, pool_settings
from ruvllm.testing.speculative import COPY_PROMPT, FIXED_DRAFTS
from selenium.webdriver.common.by import By
from selenium.webdriver.support.select import Select
from server_helpers import RunningServer, _require_backend, serve_app, start_server

TWO_MODELS = """
[[models]]
name = "small"
model = "default"
backend = "llamacpp"
preload = true

[[models]]
name = "other"
model = "default"
backend = "llamacpp"
preload = true
"""


@pytest.fixture(scope="module")
def driver():
    with chromium_driver() as browser:
        yield browser


@pytest.fixture(scope="module")
def two_models(tmp_path_factory) -> Iterator[RunningServer]:
    _require_backend("llamacpp")
    path = tmp_path_factory.mktemp("cfg") / "ruvllm.toml"
    path.write_text(TWO_MODELS)
    config = load_config(path, env={})
    pool = build_pool(config)
    running = serve_app(create_app(pool, pool_settings(config, pool)), engine=None)
    yield running
    running.stop()


def generated_tokens(url: str, model_name: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("ruvllm:generation_tokens_total{") and f'model_name="{model_name}"' in line)


def test_the_picker_sends_the_chosen_model(driver, two_models: RunningServer):
    open_page(driver, two_models.url + "/")
    assert driver.find_element(By.ID, "model-picker").is_displayed()
    picker = Select(driver.find_element(By.ID, "model"))
    assert [o.text for o in picker.options] == ["small", "other"]
    picker.select_by_visible_text("other")
    set_field(driver, "max-tokens", "4")
    ask(driver, "Hello!")
    assert finished_answer(driver)[0] == "done"
    assert generated_tokens(two_models.url, "other") > 0
    assert generated_tokens(two_models.url, "small") == 0
    # The choice is a setting the browser keeps.
    driver.refresh()
    wait_for(lambda: Select(driver.find_element(By.ID, "model")).first_selected_option.text == "other",
             "the chosen model after a reload")
    assert console_errors(driver) == []


@pytest.fixture(scope="module")
def sona_server() -> Iterator[tuple[RunningServer, object]]:
    sona_plugin = pytest.importorskip("ruvllm_sona")
    running = start_server(api_key=None, backend="candle_like",
                           backend_options={"dtype": "auto", "kv_cache_tokens": 4096})
    sona = sona_plugin.attach(running.engine, sona_plugin.SonaOptions(interval=0), start=False)
    yield running, sona
    sona_plugin.detach(running.engine)
    running.stop()


def test_good_and_bad_marks_reach_sona(driver, sona_server):
    server, sona = sona_server
    open_page(driver, server.url + "/")
    wait_for(lambda: driver.find_element(By.ID, "status-feedback").text.startswith("on"),
             "the status panel to see SONA")
    set_field(driver, "max-tokens", "6")
    ask(driver, "Say hi.")
    assert finished_answer(driver)[0] == "done"
    driver.find_element(By.CSS_SELECTOR, "#messages .assistant .thumb.good").click()
    wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "#messages .assistant .thumb.good.chosen"),
             "the mark to be recorded")
    assert [r.feedback for r in sona.store.snapshot()] == [1.0]
    assert not driver.find_element(By.ID, "chat-error").is_displayed()


@pytest.fixture(scope="module")
def speculative_server() -> Iterator[RunningServer]:
    running = start_server(api_key=None, engine_options=FIXED_DRAFTS)
    yield running
    running.stop()


def test_speculative_acceptance_is_shown(driver, speculative_server: RunningServer):
    open_page(driver, speculative_server.url + "/")
    assert not driver.find_element(By.ID, "status-spec").is_displayed()  # nothing drafted yet
    set_field(driver, "max-tokens", "24")
    set_field(driver, "temperature", "0")
    ask(driver, COPY_PROMPT)
    assert finished_answer(driver)[0] == "done"
    # The answer's own counts (its usage), then the server's since the start (/metrics).
    assert " drafted tokens accepted" in driver.find_element(By.ID, "status-speed").text
    spec = wait_for(lambda: (e := driver.find_element(By.ID, "status-spec")).is_displayed() and e.text,
                    "the speculative row")
    assert spec.endswith("drafted tokens accepted since the start")


def test_a_server_that_stops_answering_is_said_so(driver):
    server = start_server(api_key=None)
    try:
        open_page(driver, server.url + "/")
        lost = driver.find_element(By.ID, "status-lost")
        assert not lost.is_displayed()
    finally:
        server.stop()
    wait_for(lost.is_displayed, "the status panel to see the server gone", timeout=20)


@pytest.fixture(scope="module")
def thinking_server() -> Iterator[RunningServer]:
    # deepseek: every model's <think>...</think> is split from its answer, this one's included.
    running = start_server(api_key=None, server={"reasoning_format": "deepseek"})
    yield running
    running.stop()


def test_the_reasoning_is_shown_apart_from_the_answer(driver, thinking_server: RunningServer):
    open_page(driver, thinking_server.url + "/")
    forced = r"<think>\nweighing it\n</think>\n\nFour\."
    add_to_chat_requests(driver, {"structured_outputs": {"regex": forced}})
    ask(driver, "What is two plus two?")
    assert finished_answer(driver) == ("done", "Four.")
    details = driver.find_element(By.CSS_SELECTOR, "#messages .assistant details.reasoning")
    assert details.get_attribute("open") is None  # folded once the answer came
    details.find_element(By.TAG_NAME, "summary").click()
    assert details.find_element(By.CSS_SELECTOR, ".thought").text == "weighing it"

