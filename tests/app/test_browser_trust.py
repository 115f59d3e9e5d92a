"""Issue 8, item 2 in a real headless Chromium: Markdown in URL values is shown as text. A link
whose `mask` is a Markdown link, or whose `trace` is a Markdown image, must leave no external
anchor or image on the page and make the browser fetch nothing from the outside host, while
the value itself is still shown (so the user sees what was wrong).

Skips cleanly when /usr/bin/chromium or playwright is missing. Never downloads a browser.
"""

from __future__ import annotations

import time
from urllib.parse import quote, urlparse

import pytest

pytestmark = pytest.mark.browser

from tests.app.test_browser import CHROMIUM, CHROMIUM_ARGS, N, run_server  # noqa: E402  (skips)

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

HOST = "198.51.100.7"
HOSTILE = [
    ("mask", f"[Open the corrected view](http://{HOST}/phish)", "Open the corrected view"),
    ("trace", f"![t](http://{HOST}/t.png)", f"{HOST}/t.png"),
    ("mask", f"causal <img src=http://{HOST}/x.png> :red[alarm] http://{HOST}/bare", "alarm"),
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from instrumentation import make_inputs, record

    root = tmp_path_factory.mktemp("data")
    q, k, v = make_inputs(1, 1, N, 32, "fp16", seed=0)
    _, trace = record(q, k, v, mask="causal", block_m=64, block_n=64,
                      meta_extra={"input_seed": 0, "inputs": "instrumentation.make_inputs"})
    trace.save(root / "traces" / f"n{N}_causal_natural")
    return root


@pytest.fixture(scope="module")
def server(data_dir, tmp_path_factory):
    yield from run_server(data_dir, tmp_path_factory)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def _settle(page, shown: str, timeout: float = 90) -> str:
    """Wait until the app has run and `shown` is on the page; return the page's text."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = page.inner_text("body")
        running = page.query_selector('[data-testid="stStatusWidget"]')
        if shown in text and (running is None or not running.inner_text().strip()):
            return text
        time.sleep(0.5)
    raise AssertionError(f"{shown!r} never appeared; the page says: {text[:1500]}")


@pytest.mark.parametrize("key,value,shown", HOSTILE)
@pytest.mark.parametrize("page_name", ["block_skip", "schedule"])
def test_markdown_in_link_values_is_text(server, browser, key, value, shown, page_name):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    outside = []
    page.on("request", lambda r: outside.append(r.url) if urlparse(r.url).hostname == HOST else None)
    # answer any request to the outside host locally, so a failure is seen, not waited for
    page.route(lambda u: urlparse(u).hostname == HOST, lambda route: route.fulfill(status=204, body=""))
    source = "recorded" if key == "trace" else "interpreter"
    url = (f"{server}/?page={page_name}&source={source}&seq_len={N}&head_dim=32&block_m=64"
           f"&block_n=64&{key}={quote(value, safe='')}")
    try:
        page.goto(url)
        text = _settle(page, shown)
        anchors = page.eval_on_selector_all(
            "a[href]", "els => els.map(e => e.href).filter(h => new URL(h).hostname === '198.51.100.7')")
        images = page.eval_on_selector_all(
            "img[src]", "els => els.map(e => e.src).filter(s => new URL(s).hostname === '198.51.100.7')")
        assert anchors == [] and images == [], (anchors, images)
        assert outside == [], outside
        assert "Traceback" not in text
    finally:
        ctx.close()
