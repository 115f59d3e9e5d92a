"""Link values in a real headless Chromium: Markdown in URL values is shown as text. A link
whose `mask` is a Markdown link, or whose `trace` is a Markdown image, must leave no external
anchor or image on the page and make the browser fetch nothing from the outside host, while
the value itself is still shown (so the user sees what was wrong).

Every hostile value is shown by the one warning line app.url_state writes for any page (a
mask that does not parse, a recording that is not bundled), so the three values go in two page
loads, each page once: the Markdown link as a live link's mask on the block-skip page, the image
as a recorded link's trace together with the HTML / colour / bare-URL mask on the schedule page
(a request to the outside host names the value it came from: /phish, /t.png, /x.png, /bare).

Runs on the session's one server and Chromium (tests/app/conftest.py); skips cleanly when
/usr/bin/chromium or playwright is missing. Never downloads a browser.
"""

from __future__ import annotations

from urllib.parse import quote, urlparse

import pytest

pytestmark = pytest.mark.browser

N = 256

HOST = "198.51.100.7"
LINK = ("mask", f"[Open the corrected view](http://{HOST}/phish)", "Open the corrected view")
IMAGE = ("trace", f"![t](http://{HOST}/t.png)", f"{HOST}/t.png")
HTML = ("mask", f"causal <img src=http://{HOST}/x.png> :red[alarm] http://{HOST}/bare", "alarm")
# (page, source, the hostile values): every value once, each page once
CASES = [("block_skip", "interpreter", [LINK]), ("schedule", "recorded", [IMAGE, HTML])]


SETTLED_JS = """shown => document.body.innerText.includes(shown)
  && !((document.querySelector('[data-testid="stStatusWidget"]') || {}).innerText || '').trim()"""


def _settle(page, shown: str, timeout: float = 90) -> str:
    """Wait until the app has run and `shown` is on the page; return the page's text."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(SETTLED_JS, arg=shown, timeout=timeout * 1000)
    except PlaywrightTimeout:
        raise AssertionError(f"{shown!r} never appeared; the page says: {page.inner_text('body')[:1500]}") from None
    return page.inner_text("body")


@pytest.mark.parametrize("page_name,source,hostile", CASES,
                         ids=[f"{p}-{'+'.join(k for k, _, _ in h)}" for p, _, h in CASES])
def test_markdown_in_link_values_is_text(app_server, new_page, page_name, source, hostile):
    page = new_page(1400, 1000)
    outside = []
    page.on("request", lambda r: outside.append(r.url) if urlparse(r.url).hostname == HOST else None)
    # answer any request to the outside host locally, so a failure is seen, not waited for
    page.route(lambda u: urlparse(u).hostname == HOST, lambda route: route.fulfill(status=204, body=""))
    url = (f"{app_server}/?page={page_name}&source={source}&seq_len={N}&head_dim=32&block_m=64&block_n=64"
           + "".join(f"&{key}={quote(value, safe='')}" for key, value, _ in hostile))
    page.goto(url)
    for _, _, shown in hostile:
        text = _settle(page, shown)
    anchors = page.eval_on_selector_all(
        "a[href]", "els => els.map(e => e.href).filter(h => new URL(h).hostname === '198.51.100.7')")
    images = page.eval_on_selector_all(
        "img[src]", "els => els.map(e => e.src).filter(s => new URL(s).hostname === '198.51.100.7')")
    assert anchors == [] and images == [], (anchors, images)
    assert outside == [], outside
    assert "Traceback" not in text
