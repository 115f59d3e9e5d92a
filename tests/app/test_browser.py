"""The app in a real headless Chromium: `streamlit run app/main.py` as a subprocess, driven with
Playwright. Settings from the URL, the animation's play button, switching the mask, downloads
checked by their content, live edits applied by one Run button (with stale messages gone while
it runs), the copy-link box reopening the same view, and presentation mode.

One server and one Chromium for all browser tests, a fresh context per test (tests/app/conftest.py).
Skips cleanly when /usr/bin/chromium or playwright is missing. Never downloads a browser.
"""

from __future__ import annotations

import json
import re
import zipfile
import time
from pathlib import Path

import pytest

from tests.app.live_app import chart_titles, choose_option, menu_button, no_exception_on_page, wait_for_title

pytestmark = pytest.mark.browser

N = 256
QUERY = f"source=interpreter&seq_len={N}&head_dim=32&block_m=64&block_n=64&dtype=fp16"


def test_url_settings_show_on_the_page_and_mask_switch(app_server, page):
    """A link's settings on the page (opened on the path form of the sidebar's page links, which
    must not say "Page not found"), the mask switched with Run, then the chart as standalone HTML;
    last, the same view in presentation mode (presentation_hides_the_sidebar_and_fits_each_chart,
    on this page load)."""
    page.goto(f"{app_server}/block_skip?page=block_skip&{QUERY}&mask=sliding_window:64")
    wait_for_title(page, f"Block map: sliding_window:64, N={N}, blocks 64×64")
    no_page_not_found(page, "/block_skip")
    no_exception_on_page(page)
    sidebar = page.locator('[data-testid="stSidebar"]')
    # the sidebar's inputs take the link's values as the page settles (read too early under load: 0)
    for label, want in (("Sequence length N", str(N)), ("Window W (keys i-W < j <= i)", "64")):
        box = sidebar.get_by_label(label)
        deadline = time.monotonic() + 60
        while box.input_value() != want and time.monotonic() < deadline:
            page.wait_for_timeout(200)
        assert box.input_value() == want, label
    page.wait_for_function("() => [...document.querySelectorAll('[data-testid=\"stAlert\"]')]"   # may come
                           ".some(a => a.innerText.includes('visited exactly'))")          # after the chart

    # switch the mask in the sidebar and press Run: the chart and the URL follow
    choose_option(page, sidebar.locator('[data-testid="stSelectbox"]').filter(has_text="Mask"), "causal")
    sidebar.get_by_role("button", name="Run").click()
    wait_for_title(page, f"Block map: causal, N={N}, blocks 64×64")
    page.wait_for_function("() => location.search.includes('mask=causal')")
    assert "page=block_skip" in page.url and f"seq_len={N}" in page.url
    no_exception_on_page(page)
    standalone_html_downloads(page, f"Block map: causal, N={N}")

    # the same view in presentation mode, switched on in the sidebar, in a 1600 x 900 window
    page.set_viewport_size({"width": 1600, "height": 900})
    sidebar.locator('[data-testid="stCheckbox"]').filter(has_text="Presentation mode").click()
    page.wait_for_function("() => location.search.includes('present=1')")
    presentation_hides_the_sidebar_and_fits_each_chart(page)


def standalone_html_downloads(page, title: str) -> None:
    """The chart's export menu gives the chart `title` as a standalone HTML page."""
    with page.expect_download() as info:
        menu_button(page, "⬇ Export chart", "⬇ HTML").click()
    html = Path(info.value.path()).read_text()
    assert html.lstrip().lower().startswith("<html") or "<!doctype" in html[:100].lower(), html[:200]
    assert "Plotly.newPlot" in html and title in html, "the standalone HTML draws the chart"


def no_page_not_found(page, path: str) -> None:
    """Streamlit serves its default page at "/" only: a reload after the sidebar's page links
    (/block_skip?page=block_skip&...) or /schedule showed "Page not found" over the page. Checked
    once the run has ended (Streamlit sends that notice during the run, before its end)."""
    page.wait_for_function("() => { const a = document.querySelector('[data-testid=\"stApp\"]');"
                           " return a && a.getAttribute('data-test-script-state') !== 'running'; }")
    assert page.get_by_text("Page not found").count() == 0, path


def test_schedule_page_downloads_its_data_and_images_and_plays(app_server, page):
    """One schedule page: the trace data downloads (Chrome trace JSON, CSV zip) checked by their
    content; images rendered by kaleido on the server when the button is clicked (PNG), a video
    made on request (the button says how long) then offered as a download (GIF); and the
    animation's play button moves the tile grid. Opened on a path naming the page (/schedule?...),
    which must not say "Page not found"."""
    page.goto(f"{app_server}/schedule?{QUERY}&mask=causal")
    wait_for_title(page, "Work items on SMs (modelled timeline)")
    no_page_not_found(page, "/schedule")
    no_exception_on_page(page)
    with page.expect_download() as info:
        menu_button(page, "⬇ Trace data", "⬇ schedule (Chrome trace JSON)").click()
    doc = json.loads(Path(info.value.path()).read_text())
    slices = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    assert len(slices) == N // 64 and doc["otherData"]["modelled"] is True
    assert "Triton CPU interpreter" in doc["otherData"]["provenance"]

    with page.expect_download() as info:
        menu_button(page, "⬇ Trace data", "⬇ trace (CSV zip)").click()
    with zipfile.ZipFile(info.value.path()) as zf:
        work = zf.read("trace/work.csv").decode().splitlines()
        meta = json.loads(zf.read("trace/meta.json"))
    assert len(work) == 1 + N // 64 and work[0].startswith("bh,")
    assert meta["mask"] == "causal" and meta["shape"]["N"] == N

    with page.expect_download(timeout=120_000) as info:
        menu_button(page, "⬇ Export chart", "⬇ PNG").click()
    png = Path(info.value.path()).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    page.locator('[data-testid="stPopoverButton"]').filter(has_text="⬇ Video").first.click()
    page.get_by_role("button", name=re.compile(r"^Make the GIF")).click()
    with page.expect_download(timeout=180_000) as info:
        page.get_by_role("button", name=re.compile(r"whole-gpu-schedule\.gif")).click(timeout=180_000)
    gif = Path(info.value.path()).read_bytes()
    assert gif[:6] in (b"GIF89a", b"GIF87a") and len(gif) > 10_000
    page.keyboard.press("Escape")

    wait_for_title(page, "over time (modelled timeline)")
    anim = page.locator(".js-plotly-plot").filter(has=page.locator(".updatemenu-button")).first
    first = anim.locator(".g-gtitle").text_content()
    assert "t = " in first and "tile-units" in first
    anim.locator(".updatemenu-button").filter(has_text="play").click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('.js-plotly-plot')].some(p => p._fullLayout && "
        "p._fullLayout.sliders && p._fullLayout.sliders.length && p._fullLayout.sliders[0].active > 5)",
        timeout=30_000)
    assert anim.locator(".g-gtitle").text_content() != first
    no_exception_on_page(page)


def test_fresh_server_opened_on_a_page_path_copy_link_and_nav_keep_settings(fresh_app_server, new_page):
    """A server no session has used, opened on a path naming the page (online softmax, the link's
    window in the sidebar); then the copy-link box reopens the same page state (a step taken with
    Next) in a new session; last, the page navigation keeps the settings and writes them back into
    the URL. One page load for the three (the copy-link check opened its own page)."""
    page = new_page(timeout_ms=90_000)
    app_server = fresh_app_server
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=app_server)
    page.goto(f"{app_server}/online_softmax?{QUERY}&mask=sliding_window:96")
    wait_for_title(page, "Online softmax state, step by step")
    no_exception_on_page(page)
    sidebar = page.locator('[data-testid="stSidebar"]')
    assert sidebar.get_by_label("Window W (keys i-W < j <= i)").input_value() == "96"

    copy_link_reopens_the_same_page_state(page, app_server)

    # the page navigation keeps the settings and writes them back into the URL
    sidebar.get_by_role("link", name="Block-skip map").click()
    wait_for_title(page, f"Block map: sliding_window:96, N={N}, blocks 64×64")
    page.wait_for_function("() => location.search.includes('page=block_skip')")
    assert "mask=sliding_window%3A96" in page.url or "mask=sliding_window:96" in page.url
    no_exception_on_page(page)


def copy_link_reopens_the_same_page_state(page, app_server: str) -> None:
    """On an online-softmax page: a step with Next, the sidebar's link (its Copy button) opened in
    a new session shows the same step's chart."""
    wait_for_title(page, "K blocks of query row")
    page.get_by_role("button", name="Next").click()
    page.wait_for_function("() => location.search.includes('sm_step=')")
    step = dict(x.split("=") for x in page.url.split("?")[1].split("&"))["sm_step"]
    title = [t for t in chart_titles(page) if "K blocks of query row" in t][0]
    # the sidebar's link field (filled at the end of the run), copied with its Copy button
    page.wait_for_function("s => document.querySelector('.tilescope-link input').value.includes(s)",
                           arg=f"sm_step={step}")
    page.locator('[data-testid="stSidebar"] .tilescope-link').get_by_role("button", name="Copy").click()
    link = page.evaluate("() => navigator.clipboard.readText()")
    assert link.startswith(app_server) and f"sm_step={step}" in link and "page=online_softmax" in link, link
    other = page.context.new_page()               # a new session opened on the link
    other.set_default_timeout(90_000)
    other.goto(link)
    wait_for_title(other, "K blocks of query row")
    assert title in chart_titles(other)
    assert f"sm_step={step}" in other.url
    no_exception_on_page(other)
    other.close()


def test_two_sessions_changing_settings_at_once_both_get_their_charts(app_server, new_page):
    """Two browser sessions start live runs at the same moment: the run lock serialises them,
    and each session gets its own chart."""
    pages = [new_page(1300, 900, timeout_ms=90_000) for _ in range(2)]
    wanted = [("document:64,128,128", 320), ("sliding_window:40", 352)]
    for p, (mask, n) in zip(pages, wanted):
        p.goto(f"{app_server}/?page=block_skip&source=interpreter&seq_len={n}&head_dim=16"
               f"&block_m=32&block_n=32&dtype=fp32&mask={mask}", wait_until="commit")
    for p, (mask, n) in zip(pages, wanted):
        wait_for_title(p, f"Block map: {mask}, N={n}, blocks 32×32", timeout=90_000)
        assert "visited exactly" in " ".join(p.locator('[data-testid="stAlert"]').all_inner_texts())
        no_exception_on_page(p)


def sidebar_number(page, label: str, value: int) -> None:
    field = page.locator('[data-testid="stSidebar"]').get_by_label(label)
    field.fill(str(value))
    field.press("Tab")          # commits the value (a fragment rerun of the sidebar only)


def test_live_edits_run_once_with_the_run_button_and_clear_stale_messages(app_server, page):
    page.goto(f"{app_server}/?page=block_skip&{QUERY}&mask=sliding_window:64&seq_len=-64")
    page.wait_for_selector('[data-testid="stAlertContentError"]')
    assert "not valid" in page.locator('[data-testid="stAlertContentError"]').first.inner_text()
    sidebar = page.locator('[data-testid="stSidebar"]')
    # two edits: nothing runs, the error stays, the sidebar says what is pending and the estimate
    sidebar_number(page, "Sequence length N", 352)
    sidebar_number(page, "Window W (keys i-W < j <= i)", 40)
    page.wait_for_function("() => document.body.innerText.includes('sliding_window:64 → sliding_window:40')"
                           " && document.body.innerText.includes('Estimated run time')")
    text = sidebar.inner_text()
    assert "seq_len -64 → 352" in text and "sliding_window:64 → sliding_window:40" in text
    assert "Estimated run time ≈" in text and "An estimate" in text
    assert page.locator('[data-testid="stAlertContentError"]').count() == 1
    assert "seq_len=-64" in page.url
    # ... and the Run button with them is in the window, not below the sidebar's fold
    run = sidebar.get_by_role("button", name="Run").bounding_box()
    assert run is not None and run["y"] + run["height"] <= page.viewport_size["height"], run
    # one press: while the kernel runs, the old error is gone; then the new view
    sidebar.get_by_role("button", name="Run").click()
    page.wait_for_function(
        "() => document.body.innerText.includes('Running the kernel') || "
        "[...document.querySelectorAll('.js-plotly-plot .gtitle')].some(t => t.textContent.includes('N=352'))")
    assert page.locator('[data-testid="stAlertContentError"]').count() == 0
    wait_for_title(page, "Block map: sliding_window:40, N=352, blocks 64×64")
    page.wait_for_function("() => location.search.includes('seq_len=352')")
    assert "Not run yet" not in sidebar.inner_text()
    no_exception_on_page(page)


def presentation_hides_the_sidebar_and_fits_each_chart(page) -> None:
    """Presentation mode (the sidebar's switch) on `page`, a 1600 x 900 window: no sidebar, no info
    banner, every chart a whole 16:9 slide on screen at least 3/4 size; Leave presentation brings
    the sidebar and the unscaled charts back."""
    # 1600 x 900 holds each 1280 x 720 slide with the page's controls drawn above it (the head
    # picker, the comparison's two rows of block sizes) and its export row, at least 3/4 size (sidebar gone)
    # the charts' boxes read in the same evaluation that finds them scaled: while the page reruns for
    # the switch it can hold no chart for a moment (and every() of none is true)
    boxes = page.wait_for_function("""() => {
        const plots = [...document.querySelectorAll('.js-plotly-plot')];
        const scale = el => parseFloat((el.style.transform.match(/scale\\(([0-9.]+)/) || [0, 0])[1]);
        if (!plots.length || !plots.every(el => scale(el) > 0.75)) return null;
        return plots.map(p => { const r = p.getBoundingClientRect();
                                return [r.left, r.width, r.height, p._fullLayout.width, p._fullLayout.height]; });
    }""").json_value()
    assert not page.locator('[data-testid="stSidebar"]').is_visible()
    assert page.locator('[data-testid="stAlertContentInfo"]').filter(visible=True).count() == 0
    assert boxes
    for left, w, h, fw, fh in boxes:          # the whole slide on screen, aspect kept
        assert left >= 0 and left + w <= 1600 and h <= 900
        assert w > 0.75 * fw and abs(w / h - fw / fh) < 0.01
    first = boxes[0]
    assert abs(first[3] / first[4] - 16 / 9) < 0.01          # a 16:9 slide
    page.get_by_role("button", name="Leave presentation").click()
    page.wait_for_function("() => !location.search.includes('present=1')")
    page.locator('[data-testid="stSidebar"]').wait_for(state="visible")
    page.wait_for_function("() => { const plots = [...document.querySelectorAll('.js-plotly-plot')];"
                           " return plots.length > 0 && plots.every(el => !el.style.transform); }")
    no_exception_on_page(page)
