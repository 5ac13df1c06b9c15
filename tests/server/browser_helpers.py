"""A headless Debian chromium driven by Selenium, for the chat page's tests.

The browser is the system's (``make setup`` installs ``chromium`` and ``chromium-driver`` with
apt-get): nothing is downloaded at test time, and a machine without it fails the tests with the
reason instead of skipping them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

#: Wraps the page's fetch once; ``window.extraChatFields`` is what :func:`add_to_chat_requests` set last.
_WRAP_FETCH = """
const wrapped = window.extraChatFields !== undefined;
window.extraChatFields = arguments[0];
if (!wrapped) {
  const original = window.fetch;
  window.fetch = (url, init) => {
    if (String(url).endsWith("/v1/chat/completions") && init && init.body) {
      init = {...init, body: JSON.stringify({...JSON.parse(init.body), ...window.extraChatFields})};
    }
    return original(url, init);
  };
}
"""

#: The last assistant message's state ("streaming", "done", "stopped", "error") and its text.
LAST_ANSWER = """
const m = [...document.querySelectorAll("#messages .message.assistant")].at(-1);
return m ? [m.dataset.state, m.querySelector(".content").textContent] : null;
"""


@contextlib.contextmanager
def chromium_driver() -> Iterator[webdriver.Chrome]:
    """A headless chromium session, or a failed test that says what to install.

    Chromium and chromedriver keep their temporary files (a profile, the singleton socket's
    directory) under a TMPDIR of the session's own, removed after it: in /tmp, quit() left an
    ``org.chromium.Chromium.*`` directory behind each time."""
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        pytest.fail("the chat page's tests need Debian's chromium and chromium-driver "
                    f"(chromium: {chromium or 'not found'}, chromedriver: {chromedriver or 'not found'}): "
                    "run `make setup`, which installs them, or `apt-get install chromium chromium-driver`",
                    pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,900", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    # The console, to fail on any error the page logs (a CSP violation is one).
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    with tempfile.TemporaryDirectory(prefix="ruvllm-chromium-") as tmp:
        service = webdriver.ChromeService(executable_path=chromedriver, env={**os.environ, "TMPDIR": tmp})
        driver = webdriver.Chrome(options=options, service=service)
        try:
            driver.set_script_timeout(30)
            yield driver
        finally:
            driver.quit()


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 60.0, every: float = 0.05) -> Any:
    """``condition()``'s first truthy value, polled for ``timeout`` seconds; else a failure naming
    ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    pytest.fail(f"timed out after {timeout:g} s waiting for {what}")


def add_to_chat_requests(driver, fields: dict[str, Any]) -> None:
    """Every chat request the page sends from now on (until the next load) carries ``fields``, in
    place of an earlier call's: how a test asks the server for a known answer
    (``structured_outputs``, ``min_tokens``) through the page's own request, without the page
    offering such fields."""
    driver.execute_script(_WRAP_FETCH, fields)


def console_errors(driver) -> list[str]:
    """The page's console errors since the last call (the log is drained by reading it)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def open_page(driver, url: str, *, connected: bool = True) -> None:
    """A fresh page at ``url`` with nothing stored in the browser from an earlier test."""
    driver.get(url)
    driver.execute_script("localStorage.clear(); sessionStorage.clear();")
    driver.get(url)
    if connected:
        wait_for(lambda: driver.execute_script("return document.body.classList.contains('connected')"),
                 "the page to connect to the server", timeout=20)


def set_field(driver, element_id: str, value: str) -> None:
    field = driver.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(value)


def ask(driver, prompt: str) -> None:
    set_field(driver, "prompt", prompt)
    driver.find_element(By.ID, "send").click()


def last_answer(driver) -> tuple[str, str] | None:
    found = driver.execute_script(LAST_ANSWER)
    return tuple(found) if found else None


def finished_answer(driver, timeout: float = 120.0) -> tuple[str, str]:
    return wait_for(lambda: (a := last_answer(driver)) and a[0] != "streaming" and a,
                    "the answer to finish", timeout=timeout)
