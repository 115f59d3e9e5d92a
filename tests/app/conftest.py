"""Fixtures shared by the app tests.

Headless (AppTest): `data_dir`, small recordings made once per session in the interpreter
(three schedules of one causal problem, a sliding-window and a B=2 H=2 prefix one, a tiny
sweep), with TILESCOPE_DATA pointing at them while a module uses them.

Browser (Playwright): ONE `streamlit run app/main.py` server on the bundled data/ and ONE
headless system Chromium for the whole session, a fresh browser context per test (`page`, or
`new_page(...)` for another window size). tests/conftest.py runs the browser tests last, so the
Chromium (and the asyncio loop Playwright's sync API holds) is closed before nothing else runs.
They skip cleanly without /usr/bin/chromium or playwright, and never download a browser.
"""

import importlib.util
from contextlib import ExitStack
from pathlib import Path

import pytest

# The app needs plotly and streamlit; a machine without them (the bare GPU image) skips this folder.
if importlib.util.find_spec("plotly") is None or importlib.util.find_spec("streamlit") is None:
    collect_ignore_glob = ["test_*.py"]

N = 256          # the sequence length of the shared headless recordings


@pytest.fixture(scope="session")
def app_recordings(tmp_path_factory):
    """A data/ directory with three small recordings of one problem (three schedules), a
    sliding-window one, a B=2 H=2 prefix one, and a tiny naive-vs-flash sweep, all made here in
    the interpreter (no bundled GPU data needed). Recorded once; tests must not change it."""
    from instrumentation.recording.sweep import run_sweep
    from tests.app.headless import record_small

    root = tmp_path_factory.mktemp("data")
    for sched in ("natural", "longest_first", "persistent"):
        record_small(root, f"n{N}_causal_{sched}", n=N, schedule=sched)
    record_small(root, f"n{N}_sliding_natural", n=N, mask="sliding_window:64")
    record_small(root, f"n{N}_prefix_b2h2", n=N, mask="prefix_lm:48", b=2, h=2)
    run_sweep(root / "sweeps" / "cpu.json", seq_lens=[32, 64], batch=1, heads=1, head_dim=32,
              dtype="fp16", mask="full", progress=False)
    return root


@pytest.fixture(scope="module")
def data_dir(app_recordings):
    """The shared recordings, with the app pointed at them (TILESCOPE_DATA) for this module."""
    from tests.app.headless import tilescope_data

    with tilescope_data(app_recordings):
        yield app_recordings


# -- browser tests ------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def browser():
    """One headless system Chromium for every browser test."""
    from tests.app.live_app import CHROMIUM, CHROMIUM_ARGS

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed: the browser tests need a system Chromium")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def new_page(browser):
    """new_page(width, height, **context_options): a page in a fresh browser context (its own
    cookies, session and clipboard), closed after the test."""
    contexts = []

    def make(width: int = 1500, height: int = 1100, timeout_ms: float = 60_000, **options):
        ctx = browser.new_context(viewport={"width": width, "height": height}, **options)
        contexts.append(ctx)
        p = ctx.new_page()
        p.set_default_timeout(timeout_ms)
        return p

    yield make
    for ctx in contexts:
        ctx.close()


@pytest.fixture
def page(new_page):
    return new_page(accept_downloads=True)


@pytest.fixture(scope="session")
def _shared_server(browser, tmp_path_factory):
    """The session's one server, started by the first test that asks for it."""
    with ExitStack() as stack:
        yield {"url": None, "stack": stack}


def _start_server(stack: ExitStack, tmp_path_factory) -> str:
    from tests.app.live_app import ROOT, streamlit_server

    log = tmp_path_factory.mktemp("streamlit_log") / "streamlit.log"
    return stack.enter_context(streamlit_server(ROOT / "data", log))


@pytest.fixture
def app_server(_shared_server, tmp_path_factory) -> str:
    """The URL of the session's one app server (the bundled data/, interpreter for live runs)."""
    if _shared_server["url"] is None:
        _shared_server["url"] = _start_server(_shared_server["stack"], tmp_path_factory)
    return _shared_server["url"]


@pytest.fixture
def fresh_app_server(_shared_server, tmp_path_factory):
    """A server no session has used yet. The shared one when nothing has opened it (the tests
    asking for this run first among the browser tests), else one started for this test alone."""
    if _shared_server["url"] is None:
        _shared_server["url"] = _start_server(_shared_server["stack"], tmp_path_factory)
        yield _shared_server["url"]
    else:
        with ExitStack() as own:
            yield _start_server(own, tmp_path_factory)
