"""The analyst's console in a real browser: headless Chromium from the system's packages, driven by Playwright,
against the console over the session's embedded broker and a bank's applied Feast repo (``console_setup.py``, the
set-up ``test_console.py`` uses).

No browser is downloaded at run time (``playwright install`` needs a CDN this project cannot count on): the test
launches the system's Chromium (``$FEDFRAUD_CHROMIUM``, else ``chromium``, ``chromium-browser`` or
``google-chrome`` on ``PATH``) and skips, with one line naming what is missing and how to get it, when there is no
Chromium or no ``playwright`` (the ``dev`` extra). With ``FEDFRAUD_UPDATE_SCREENSHOTS=1`` its screenshots replace
``docs/console-queue.png`` and ``docs/console-case.png``; otherwise they go to the test's tmp folder.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.integration.console_setup import (
    HOSTILE_MERCHANT,
    HOSTILE_REASON,
    PAN,
    PAN_PREFIX,
    assert_label_on_topic_audited_and_joined,
    build_console_bank,
    newest_decline,
    served_console,
)

pytestmark = [pytest.mark.integration, pytest.mark.long]

CHROMIUM_ENV = "FEDFRAUD_CHROMIUM"
SCREENSHOTS_ENV = "FEDFRAUD_UPDATE_SCREENSHOTS"
DOCS = Path(__file__).resolve().parents[2] / "docs"
CLICKS = "fedfraud-test-clicks"

# Counts the clicks the browser delivers to the page (trusted events only, in the capture phase, so before any
# navigation); sessionStorage keeps the count across the tab's page loads.
_COUNT_CLICKS = f"""
document.addEventListener("click", (event) => {{
  if (event.isTrusted) {{
    sessionStorage.setItem("{CLICKS}", String(Number(sessionStorage.getItem("{CLICKS}") || 0) + 1));
  }}
}}, true);
"""


def _chromium() -> str:
    """The system's Chromium, or a skip naming how to get one."""
    configured = os.environ.get(CHROMIUM_ENV, "").strip()
    if configured:
        if Path(configured).is_file() and os.access(configured, os.X_OK):
            return configured
        pytest.skip(f"${CHROMIUM_ENV}={configured} is not an executable file")
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip(f"no Chromium on PATH: apt-get install chromium (Debian/Ubuntu), or set ${CHROMIUM_ENV} to a "
                "Chromium or Chrome binary")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium of the system, through Playwright (skips first, before the console is set up)."""
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed: .venv/bin/python -m pip install "
                        "-e '.[dev]' (it is in the dev extra)")
    from playwright.sync_api import sync_playwright

    executable = _chromium()
    with sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=executable, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def console(browser, tmp_path_factory: pytest.TempPathFactory, kafka_broker):
    """The console over a generated bank; the hostile decision is the oldest, so the first page shows ordinary
    declines (the screenshots in docs/console.md)."""
    bank = build_console_bank(tmp_path_factory.mktemp("console-browser-bank"))
    with served_console(bank, kafka_broker, hostile_newest=False) as served:
        yield served


def _screenshots(tmp_path: Path) -> Path:
    return DOCS if os.environ.get(SCREENSHOTS_ENV, "").strip() == "1" else tmp_path


def test_decline_to_label_in_headless_chromium(browser, console, tmp_path):
    from playwright.sync_api import expect

    shots = _screenshots(tmp_path)
    context = browser.new_context(base_url=console["url"], viewport={"width": 1280, "height": 900})
    context.add_init_script(_COUNT_CLICKS)
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    # the console's Content-Security-Policy must not block anything the pages themselves load or run
    page.on("console", lambda m: errors.append(m.text) if "Content Security Policy" in m.text else None)
    try:
        # without the cookie the queue answers 401 with the login form; log in with the token and a name
        answer = page.goto("/")
        assert answer is not None and answer.status == 401
        page.get_by_label("Your name").fill("alice")
        page.get_by_label("API token").fill(console["token"])
        with page.expect_navigation():
            page.get_by_role("button", name="Log in").click()

        # the queue: the landing page, newest decline first
        expect(page.locator("h1")).to_have_text("Decisions")
        tx = newest_decline(console)
        first = page.locator("#queue-table tbody tr").first.locator("a")
        expect(first).to_have_text(tx)
        declines = sum(d["decision"] == "fraud" for d in console["decisions"])
        expect(page.locator(".pager")).to_contain_text(f"{declines} matching")
        assert page.evaluate("typeof htmx") == "object", "htmx did not load"
        page.screenshot(path=str(shots / "console-queue.png"))
        page.evaluate(f"sessionStorage.setItem('{CLICKS}', '0')")  # clicks are counted from the queue

        # click: open the decline; its ego graph is drawn
        first.click()
        page.wait_for_url(f"**/case/{quote(tx)}")
        expect(page.locator("h1")).to_have_text(f"Case {tx}")
        ego = page.locator("#ego-graph")
        expect(ego).to_be_visible()
        assert ego.evaluate("img => img.complete && img.naturalWidth > 0 && img.naturalHeight > 0"), \
            "the ego graph image did not decode"
        page.screenshot(path=str(shots / "console-case.png"), full_page=True)

        # click: "Fraud"; htmx swaps the label box in place with the broker's acknowledgement
        page.get_by_role("button", name="Fraud", exact=True).click()
        box = page.locator("#label-box")
        expect(box).to_contain_text("acknowledged by the broker")
        expect(box).to_contain_text("Labelled fraud as analyst:alice")
        assert page.url.endswith(f"/case/{quote(tx)}"), page.url  # swapped in place, not a full-page post
        clicks = page.evaluate(f"Number(sessionStorage.getItem('{CLICKS}'))")
        assert clicks == 2, f"{clicks} clicks from the queue to the label"  # target: at most 3

        assert_label_on_topic_audited_and_joined(console, tx, "alice", tmp_path / "outcomes.sqlite")

        # the hostile record in the browser: its HTML is text, no script runs, the card number is masked
        hostile = console["hostile"]["transaction_id"]
        page.goto(f"/case/{quote(hostile)}")
        expect(page.locator("h1")).to_have_text(f"Case {hostile}")
        text = page.locator("main").inner_text()
        assert f"{HOSTILE_MERCHANT} ************1111" in text and HOSTILE_REASON in text
        assert PAN not in page.content()
        assert page.locator("main script, main img[src='x']").count() == 0
        assert PAN_PREFIX not in page.content() and "merchant **** **** **** 1111" in text
        page.goto("/?" + "decision=fraud&reason=" + quote(HOSTILE_REASON))
        expect(page.locator("#queue-table tbody tr")).to_have_count(1)
        assert dialogs == [], f"a script ran: {dialogs}"
        assert errors == [], errors
    finally:
        context.close()
