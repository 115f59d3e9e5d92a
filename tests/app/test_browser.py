"""The app in a real headless Chromium: `streamlit run app/main.py` as a subprocess, driven with
Playwright. Settings from the URL, the animation's play button, switching the mask, downloads
checked by their content, live edits applied by one Run button (with stale messages gone while
it runs), the copy-link box reopening the same view, and presentation mode.

Skips cleanly when /usr/bin/chromium or playwright is missing. Never downloads a browser.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
N = 256
QUERY = f"source=interpreter&seq_len={N}&head_dim=32&block_m=64&block_n=64&dtype=fp16"

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed: the browser tests need a system Chromium",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200 and r.read().strip() == b"ok":
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not become healthy within {timeout} s")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A tiny data/ directory recorded here (no bundled GPU data needed)."""
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


@pytest.fixture
def fresh_server(data_dir, tmp_path_factory):
    """A server no session has used yet (its very first run opened on a page path)."""
    yield from run_server(data_dir, tmp_path_factory)


def run_server(data_dir, tmp_path_factory):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TRITON_INTERPRET": "1", "TILESCOPE_DATA": str(data_dir),
           "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false", "PYTHONPATH": str(ROOT)}
    log = open(tmp_path_factory.mktemp("log") / "streamlit.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1",
         "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
        log.close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1500, "height": 1100}, accept_downloads=True)
    p = ctx.new_page()
    p.set_default_timeout(60_000)
    yield p
    ctx.close()


def chart_titles(page) -> list[str]:
    return page.locator(".js-plotly-plot .gtitle").all_text_contents()


def wait_for_title(page, needle: str, timeout: float = 60_000) -> None:
    page.wait_for_function(
        "needle => [...document.querySelectorAll('.js-plotly-plot .gtitle')]"
        ".some(t => t.textContent.includes(needle))", arg=needle, timeout=timeout)


def no_exception_on_page(page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0


def test_url_settings_show_on_the_page_and_mask_switch(server, page):
    page.goto(f"{server}/?page=block_skip&{QUERY}&mask=sliding_window:64")
    wait_for_title(page, f"Block map: sliding_window:64, N={N}, blocks 64×64")
    no_exception_on_page(page)
    sidebar = page.locator('[data-testid="stSidebar"]')
    assert sidebar.get_by_label("Sequence length N").input_value() == str(N)
    assert sidebar.get_by_label("Window W (keys i-W < j <= i)").input_value() == "64"
    assert "visited exactly" in page.locator('[data-testid="stAlert"]').all_inner_texts().__str__()

    # switch the mask in the sidebar and press Run: the chart and the URL follow
    sidebar.locator('[data-testid="stSelectbox"]').filter(has_text="Mask").locator("input").click()
    page.get_by_role("option", name="causal", exact=True).click()
    sidebar.get_by_role("button", name="Run").click()
    wait_for_title(page, f"Block map: causal, N={N}, blocks 64×64")
    page.wait_for_function("() => location.search.includes('mask=causal')")
    assert "page=block_skip" in page.url and f"seq_len={N}" in page.url
    no_exception_on_page(page)


def test_play_button_animates_the_tile_grid(server, page):
    page.goto(f"{server}/?page=schedule&{QUERY}&mask=causal")
    wait_for_title(page, "over time (modelled timeline)")
    no_exception_on_page(page)
    anim = page.locator(".js-plotly-plot").filter(has=page.locator(".updatemenu-button")).first
    first = anim.locator(".g-gtitle").text_content()
    assert "t = " in first and "tile-units" in first
    anim.locator(".updatemenu-button").filter(has_text="play").click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('.js-plotly-plot')].some(p => p._fullLayout && "
        "p._fullLayout.sliders && p._fullLayout.sliders.length && p._fullLayout.sliders[0].active > 5)",
        timeout=30_000)
    assert anim.locator(".g-gtitle").text_content() != first


def test_download_chrome_trace_and_csv(server, page):
    page.goto(f"{server}/?page=schedule&{QUERY}&mask=causal")
    wait_for_title(page, "Work items on SMs (modelled timeline)")
    with page.expect_download() as info:
        page.get_by_role("button", name="⬇ schedule (Chrome trace JSON)").click()
    doc = json.loads(Path(info.value.path()).read_text())
    slices = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    assert len(slices) == N // 64 and doc["otherData"]["modelled"] is True
    assert "Triton CPU interpreter" in doc["otherData"]["provenance"]

    with page.expect_download() as info:
        page.get_by_role("button", name="⬇ trace (CSV zip)").click()
    with zipfile.ZipFile(info.value.path()) as zf:
        work = zf.read("trace/work.csv").decode().splitlines()
        meta = json.loads(zf.read("trace/meta.json"))
    assert len(work) == 1 + N // 64 and work[0].startswith("bh,")
    assert meta["mask"] == "causal" and meta["shape"]["N"] == N


def test_download_standalone_html(server, page):
    page.goto(f"{server}/?page=block_skip&{QUERY}&mask=causal")
    wait_for_title(page, f"Block map: causal, N={N}")
    with page.expect_download() as info:
        page.get_by_role("button", name="⬇ HTML").first.click()
    html = Path(info.value.path()).read_text()
    assert html.lstrip().lower().startswith("<html") or "<!doctype" in html[:100].lower()
    assert "Plotly.newPlot" in html and f"Block map: causal, N={N}" in html


def test_download_png_and_gif(server, page):
    """Images are rendered by kaleido on the server when the button is clicked."""
    page.goto(f"{server}/?page=schedule&{QUERY}&mask=causal")
    wait_for_title(page, "Work items on SMs (modelled timeline)")
    with page.expect_download(timeout=120_000) as info:
        page.get_by_role("button", name="⬇ PNG").first.click()
    png = Path(info.value.path()).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    with page.expect_download(timeout=180_000) as info:
        page.get_by_role("button", name="⬇ animation GIF").click()
    gif = Path(info.value.path()).read_bytes()
    assert gif[:6] in (b"GIF89a", b"GIF87a") and len(gif) > 10_000


def test_fresh_server_opened_on_a_page_path_and_nav_keeps_settings(fresh_server, page):
    page.goto(f"{fresh_server}/online_softmax?{QUERY}&mask=sliding_window:96")
    wait_for_title(page, "Online softmax state, step by step")
    no_exception_on_page(page)
    sidebar = page.locator('[data-testid="stSidebar"]')
    assert sidebar.get_by_label("Window W (keys i-W < j <= i)").input_value() == "96"
    # the page navigation keeps the settings and writes them back into the URL
    sidebar.get_by_role("link", name="Block-skip map").click()
    wait_for_title(page, f"Block map: sliding_window:96, N={N}, blocks 64×64")
    page.wait_for_function("() => location.search.includes('page=block_skip')")
    assert "mask=sliding_window%3A96" in page.url or "mask=sliding_window:96" in page.url
    no_exception_on_page(page)


def test_two_sessions_changing_settings_at_once_both_get_their_charts(server, browser):
    """Two browser sessions start live runs at the same moment: the run lock serialises them,
    and each session gets its own chart."""
    contexts = [browser.new_context(viewport={"width": 1300, "height": 900}) for _ in range(2)]
    try:
        pages = [c.new_page() for c in contexts]
        wanted = [("document:64,128,128", 320), ("sliding_window:40", 352)]
        for p, (mask, n) in zip(pages, wanted):
            p.set_default_timeout(90_000)
            p.goto(f"{server}/?page=block_skip&source=interpreter&seq_len={n}&head_dim=16"
                   f"&block_m=32&block_n=32&dtype=fp32&mask={mask}", wait_until="commit")
        for p, (mask, n) in zip(pages, wanted):
            wait_for_title(p, f"Block map: {mask}, N={n}, blocks 32×32", timeout=90_000)
            assert "visited exactly" in " ".join(p.locator('[data-testid="stAlert"]').all_inner_texts())
            no_exception_on_page(p)
    finally:
        for c in contexts:
            c.close()


def sidebar_number(page, label: str, value: int) -> None:
    field = page.locator('[data-testid="stSidebar"]').get_by_label(label)
    field.fill(str(value))
    field.press("Tab")          # commits the value (a fragment rerun of the sidebar only)


def test_live_edits_run_once_with_the_run_button_and_clear_stale_messages(server, page):
    page.goto(f"{server}/?page=block_skip&{QUERY}&mask=sliding_window:64&seq_len=-64")
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


def test_copy_link_reopens_the_same_page_state(server, browser):
    ctx = browser.new_context(viewport={"width": 1500, "height": 1100})
    ctx.grant_permissions(["clipboard-read", "clipboard-write"], origin=server)
    try:
        page = ctx.new_page()
        page.set_default_timeout(90_000)
        page.goto(f"{server}/?page=online_softmax&{QUERY}&mask=causal")
        wait_for_title(page, "K blocks of query row")
        page.get_by_role("button", name="Next").click()
        page.wait_for_function("() => location.search.includes('sm_step=')")
        step = dict(x.split("=") for x in page.url.split("?")[1].split("&"))["sm_step"]
        title = [t for t in chart_titles(page) if "K blocks of query row" in t][0]
        # the sidebar's link box, copied with its own copy button
        code = page.locator('[data-testid="stSidebar"] [data-testid="stCode"]')
        code.hover()
        code.get_by_role("button").first.click()
        link = page.evaluate("() => navigator.clipboard.readText()")
        assert link.startswith(server) and f"sm_step={step}" in link and "page=online_softmax" in link
        other = ctx.new_page()                        # a new session opened on the link
        other.set_default_timeout(90_000)
        other.goto(link)
        wait_for_title(other, "K blocks of query row")
        assert title in chart_titles(other)
        assert f"sm_step={step}" in other.url
        no_exception_on_page(other)
    finally:
        ctx.close()


def test_presentation_mode_hides_the_sidebar_and_fits_each_chart(server, browser):
    ctx = browser.new_context(viewport={"width": 1600, "height": 900})
    try:
        page = ctx.new_page()
        page.set_default_timeout(90_000)
        page.goto(f"{server}/?page=block_skip&{QUERY}&mask=causal&present=1")
        wait_for_title(page, f"Block map: causal, N={N}")
        # 1600 x 900 holds a 1280 x 720 slide 1.15 times (sidebar gone, margins included)
        page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')]"
                               ".every(el => el.style.transform.startsWith('scale(1.1'))")
        assert not page.locator('[data-testid="stSidebar"]').is_visible()
        assert page.locator('[data-testid="stAlertContentInfo"]').filter(visible=True).count() == 0
        boxes = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')]
            .map(p => { const r = p.getBoundingClientRect();
                        return [r.left, r.width, r.height, p._fullLayout.width, p._fullLayout.height]; })""")
        assert boxes
        for left, w, h, fw, fh in boxes:          # the whole slide on screen, scaled up, aspect kept
            assert left >= 0 and left + w <= 1600 and h <= 900
            assert w > fw and abs(w / h - fw / fh) < 0.01
        first = boxes[0]
        assert abs(first[3] / first[4] - 16 / 9) < 0.01          # a 16:9 slide
        page.get_by_role("button", name="Leave presentation").click()
        page.wait_for_function("() => !location.search.includes('present=1')")
        page.locator('[data-testid="stSidebar"]').wait_for(state="visible")
        page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')]"
                               ".every(el => !el.style.transform)")
        no_exception_on_page(page)
    finally:
        ctx.close()
