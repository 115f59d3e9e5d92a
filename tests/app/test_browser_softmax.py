"""The online-softmax page steps in the browser: its charts carry every step, a step moves them
before the server has heard of it, and the server (the text, the link) follows.
"""

from __future__ import annotations

import re

import pytest

from tests.app.live_app import no_exception_on_page, wait_for_title

pytestmark = pytest.mark.browser

TRACE = "n1024_causal_natural"        # bundled: 16 K tiles for the default row


def test_a_step_moves_the_charts_in_the_browser_and_the_link_follows(app_server, new_page):
    """Next with the page's messages to the server held back: the tile chart and the strip show
    the next step at once (the browser stepped them); let through, the server takes the step
    (its text says it, the link carries it) and no chart is sent again (the charts keep the
    step the browser drew)."""
    page = new_page(timeout_ms=90_000)
    held, hold = [], [False]

    def route(ws):
        server = ws.connect_to_server()
        ws.on_message(lambda m: held.append(m) if hold[0] else server.send(m))
        server.on_message(ws.send)
        held.append(server)                       # held[0]: where the held messages go

    page.route_web_socket(re.compile(r".*/_stcore/stream"), route)
    page.goto(f"{app_server}/?page=online_softmax&source=recorded&trace={TRACE}&sm_step=1")
    wait_for_title(page, "Step 1 of")
    page.wait_for_function("() => document.querySelector('.ts-sm-step[data-step=\"1\"]')")
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')")
    no_exception_on_page(page)
    hold[0] = True
    page.get_by_role("button", name="Next").click()
    wait_for_title(page, "Step 2 of", timeout=10_000)               # the browser stepped the charts
    page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot .g-gtitle')]"
                           ".some(t => t.textContent.includes('step 2 of'))", timeout=10_000)    # the strip too
    assert "sm_step=2" not in page.url and len(held) > 1, "the server was not to hear of the step yet"
    hold[0] = False
    server = held.pop(0)
    for m in held:
        server.send(m)
    page.wait_for_function("() => document.querySelector('.ts-sm-step[data-step=\"2\"]')")   # the server's step
    page.wait_for_function("() => location.search.includes('sm_step=2')")
    page.wait_for_function("() => document.body.innerText.includes('Step 2/')")
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')")
    page.wait_for_timeout(300)
    titles = page.locator(".js-plotly-plot .gtitle").all_text_contents()
    assert any(t.startswith("Step 2 of") for t in titles) and not any(t.startswith("Step 1 of") for t in titles)
    no_exception_on_page(page)
