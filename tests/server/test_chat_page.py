"""The chat page in headless Chromium (Debian `chromium`, driven by playwright): it streams an
answer with its token stats, renders TeX, and a reply carrying <script> or an onerror image
does not execute."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from resin.server.launch import running
from tests.server.conftest import make_server
from tests.server.doubles import FakeEngine

CHROMIUM = os.environ.get("RESIN_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
playwright_api = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="no chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def page_url() -> Iterator[str]:
    with running(make_server(FakeEngine(step_delay=0.01))) as url:
        yield url


def test_chat_page_streams_renders_and_is_safe(page_url: str) -> None:
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        # The page's CSP blocks inline scripts too; bypass it here so this test proves the
        # renderer alone never lets a reply's markup run (the CSP is a second wall).
        page = browser.new_page(bypass_csp=True)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        response = page.goto(page_url + "/")
        assert response is not None
        assert "script-src 'self'" in response.headers["content-security-policy"]
        page.wait_for_function("document.getElementById('model').textContent === 'fake-chatml'")

        page.fill("#prompt", "hello browser")
        page.keyboard.press("Enter")
        reply = page.locator(".msg.assistant").last
        page.wait_for_function(
            "document.querySelector('.msg.assistant .stats')?.textContent.includes('tok/s')"
            " && document.querySelector('#send').hidden === false"
        )
        assert reply.locator(".content").inner_text() == "You said: hello browser"
        stats = reply.locator(".stats").inner_text()
        assert "prompt tokens" in stats and "generated" in stats and " s · " in stats
        assert float(reply.locator(".stats").get_attribute("data-tokens-per-second") or 0) > 0

        evil = '<script>window.pwnedA=1</script><img src=x onerror="window.pwnedB=2"> done'
        page.fill("#prompt", evil)
        page.click("#send")
        page.wait_for_function(
            "document.querySelectorAll('.msg.assistant .stats').length === 2"
            " && document.querySelector('#send').hidden === false"
        )
        last = page.locator(".msg.assistant").last
        assert "<script>window.pwnedA=1</script>" in last.locator(".content").inner_text()
        assert last.locator("img").count() == 0 and last.locator("script").count() == 0
        page.wait_for_timeout(300)
        assert page.evaluate("[window.pwnedA, window.pwnedB]") == [None, None]

        page.fill("#prompt", "some math please")
        page.click("#send")
        page.wait_for_function("document.querySelectorAll('.msg.assistant .stats').length === 3")
        page.wait_for_selector(".msg.assistant .katex")
        assert page.locator(".msg.assistant strong").last.inner_text() == "Euler"
        assert not errors, errors
        browser.close()


def test_chat_page_starts_at_the_models_defaults_and_counts_honestly() -> None:
    from resin.generation_config import GenerationDefaults

    defaults = GenerationDefaults(temperature=0.2, max_tokens=64)
    server = make_server(FakeEngine(step_delay=0.05), generation_defaults=defaults)
    with running(server) as url, playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(bypass_csp=True)  # string waits are evaluated scripts
        page.goto(url + "/")
        page.wait_for_function("document.getElementById('model').textContent === 'fake-chatml'")
        assert page.input_value("#temperature") == "0.2"
        assert page.input_value("#max-tokens") == "64"
        page.fill("#prompt", "a reply long enough to be read while it streams")
        page.keyboard.press("Enter")
        page.wait_for_function(
            "document.querySelector('.msg.assistant .stats')?.textContent.includes('generated')"
            " && document.querySelector('#send').hidden === true"
        )
        streaming = page.locator(".msg.assistant .stats").inner_text()
        assert "prompt tokens" not in streaming, streaming  # unknown until the usage chunk
        page.wait_for_function("document.querySelector('#send').hidden === false")
        final = page.locator(".msg.assistant .stats").inner_text()
        assert "prompt tokens" in final and not final.startswith("0 "), final
