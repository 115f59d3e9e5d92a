"""Fixtures shared by the app tests.

Headless (AppTest): `data_dir`, small recordings made once per session in the interpreter
(three schedules of one causal problem, a sliding-window and a B=2 H=2 prefix one, a tiny
sweep), with TILESCOPE_DATA pointing at them while a module uses them.

Browser (Playwright): ONE `streamlit run app/main.py` server on the bundled data/ and ONE
headless system Chromium for the whole session, a fresh browser context per test (`page`, or
`new_page(...)` for another window size). tests/conftest.py runs the browser tests last, so the
Chromium (and the asyncio loop Playwright's sync API holds) is closed before nothing else runs.
They skip with the reason when app.browser.find_browser finds no browser (BROWSER_PATH, else
PATH) or playwright is missing, and never download a browser.
"""

import importlib.util
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.once_per_run import made_once_per_run

# The app needs plotly and streamlit; a machine without them (the bare GPU image) skips this folder.
if importlib.util.find_spec("plotly") is None or importlib.util.find_spec("streamlit") is None:
    collect_ignore_glob = ["test_*.py", "*/test_*.py"]

N = 256          # the sequence length of the shared headless recordings


def _scan_installed_components_once() -> None:
    """Streamlit's component scan (scan_component_manifests: the metadata of every installed
    distribution, ~0.5 s of CPU) once per test process instead of once per AppTest: each new
    AppTest builds its own component manager and rescans, which was most of a simple page's run.
    A server scans once at its start; the installed packages do not change during the tests, so
    every AppTest still registers what is installed."""
    from functools import lru_cache

    from streamlit.components.v2 import manifest_scanner

    scan = manifest_scanner.scan_component_manifests
    if getattr(scan, "once_per_process", False):
        return

    @lru_cache(maxsize=None)
    def scanned(max_workers):
        return tuple(scan(max_workers))

    def scan_once(max_workers=None):
        return list(scanned(max_workers))

    scan_once.once_per_process = True
    manifest_scanner.scan_component_manifests = scan_once


if "collect_ignore_glob" not in globals():
    _scan_installed_components_once()


@pytest.fixture(scope="session")
def app_recordings(tmp_path_factory):
    """A data/ directory with three small recordings of one problem (three schedules), a
    sliding-window one, a B=2 H=2 prefix one, and a tiny naive-vs-flash sweep, all made here in
    the interpreter (no bundled GPU data needed). Recorded once per run: under xdist the first
    worker that asks records them into the run's shared temporary directory (a file lock), the
    others read those. Tests must not change it."""
    return made_once_per_run(tmp_path_factory, "app_recordings", _record_app_data)


def _record_app_data(root: Path) -> Path:
    from instrumentation.recording.sweep import run_sweep
    from tests.app.headless import record_small

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


# -- traces and stand-ins the figure, export and page tests share ----------------------------

@pytest.fixture
def fast_frames(monkeypatch):
    """kaleido replaced by random PNGs of the asked size (the pages and CLI tests check the
    progress reporting, not Chromium); returns the list of frame indices drawn."""
    from app.export import animations
    from tests.app.headless import random_png

    drawn = []

    class Still:
        def __init__(self, i):
            self.i = i

        def to_image(self, format, width, height, scale):
            drawn.append(self.i)
            return random_png(int(width * scale), int(height * scale), self.i)

    def no_page(*args, **kwargs):
        # the page renderer needs a browser (none found: ExportError, which export_animation
        # passes on); without it export_animation falls back to the stills below, with or without one
        raise RuntimeError("the page renderer is stubbed out: the fake kaleido stills draw the frames")

    monkeypatch.setattr(animations, "render_frames", no_page)
    monkeypatch.setattr(animations, "static_frame", lambda fig, i, **kw: Still(i))
    monkeypatch.setattr(animations, "kaleido_server", lambda: __import__("contextlib").nullcontext())
    return drawn


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A small good trace directory (the app pointed at it): the hostile tests edit copies of it."""
    from tests.app.headless import tilescope_data

    from instrumentation import make_inputs, record

    root = tmp_path_factory.mktemp("data")
    q, k, v = make_inputs(1, 1, 128, 16, "fp16", seed=1)
    _, tr = record(q, k, v, mask="causal", block_m=32, block_n=32,
                   meta_extra={"input_seed": 1, "inputs": "instrumentation.make_inputs"})
    path = tr.save(root / "traces" / "n128_causal_natural")
    with tilescope_data(root):
        yield path


@pytest.fixture
def counted_runs(monkeypatch):
    """Every kernel run the app starts, as the mask it ran with."""
    from instrumentation import recording

    real, calls = recording.record, []

    def counting(*args, **kwargs):
        calls.append(kwargs["mask"])
        return real(*args, **kwargs)

    monkeypatch.setattr(recording, "record", counting)
    return calls


@pytest.fixture(scope="module")
def trace():
    """A causal interpreter trace, two heads, N=256 (the export and figure tests draw it)."""
    from instrumentation import make_inputs, record

    q, k, v = make_inputs(1, 2, 256, 32, "fp16", seed=3)
    _, tr = record(q, k, v, mask="causal", block_m=32, block_n=32, meta_extra={"input_seed": 3})
    return tr


@pytest.fixture(scope="module")
def decode_dir(tmp_path_factory):
    """Two interpreter recordings of one decode step (B 2, H 8, H_kv 2, 200 keys, D 32):
    num_splits 1 and 3, saved side by side as the bundled ones are."""
    from instrumentation import make_decode_inputs, record_decode

    root = tmp_path_factory.mktemp("decode")
    q, k, v = make_decode_inputs(2, 8, 2, 200, 32, dtype="fp32", seed=3)
    out = {}
    for splits in (1, 3):
        _, trace = record_decode(q, k, v, num_splits=splits)
        trace.meta["source"] = "recorded"
        out[splits] = (trace, trace.save(root / f"decode_b2_ctx200_splits-{splits}"))
    return out


@pytest.fixture(scope="session")
def precision_data(tmp_path_factory):
    """A data/ directory with one tiny precision study (instrumentation.precision_study, run here
    in the interpreter: B1 H2/1 N64 D32, causal, FA3's outliers) as data/precision/tiny_outliers
    (and the same as tiny_outliers_copy), and one small flash trace for the sidebar. Made once; tests must not change it."""
    from instrumentation.precision_study import StudyPreset, run_study
    from tests.app.headless import record_small

    root = tmp_path_factory.mktemp("precision")
    tiny = StudyPreset("tiny_outliers", "FA3 outlier recipe, B1 H2/1 N64 D32, causal (test size)", 1, 2, 1, 64, 32,
                       "causal", True, False, 16)
    trace = run_study(tiny, seed=1)
    trace.meta["source"] = "recorded"
    trace.save(root / "precision" / "tiny_outliers")
    trace.save(root / "precision" / "tiny_outliers_copy")       # a second choice for the page's menu
    record_small(root, "n64_causal_natural", n=64)
    return root


# -- browser tests ------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def browser():
    """One headless system Chromium for every browser test."""
    from app.browser import find_browser, missing_reason
    from tests.app.live_app import CHROMIUM_ARGS

    chromium = find_browser()
    if chromium is None:
        pytest.skip(missing_reason("the browser tests drive Chrome or Chromium"))
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
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
        ctx.on("page", polled_waits)              # a page the test opens in this context too
        p = polled_waits(ctx.new_page())
        p.set_default_timeout(timeout_ms)
        return p

    yield make
    for ctx in contexts:
        ctx.close()


WAIT_POLL_MS = 100


def polled_waits(page):
    """`page` with its wait_for_function polling every WAIT_POLL_MS ms unless a call says otherwise
    (tests/app/slide_settle.py polls at its own POLL_MS). Playwright's default polls at every
    animation frame, so a page a test waits on (for the server's run, a chart's title) draws ~60
    frames a second: ~0.1 s of Chromium's CPU per second of waiting, ~0.02 s at 100 ms."""
    if not getattr(page, "_polled_waits", False):
        wait = page.wait_for_function

        def wait_for_function(expression, *, arg=None, timeout=None, polling=WAIT_POLL_MS):
            return wait(expression, arg=arg, timeout=timeout, polling=polling)

        page.wait_for_function = wait_for_function
        page._polled_waits = True
    return page


@pytest.fixture
def page(new_page):
    return new_page(accept_downloads=True)


@pytest.fixture(scope="session")
def _shared_server(tmp_path_factory):
    """The session's one server, started by the first test that asks for it (no browser needed:
    a plain HTTP check shares it too). `opened`: whether a test has opened a page session on it."""
    watched = tmp_path_factory.mktemp("watched") / WATCHED_RUN
    with ExitStack() as stack:
        yield {"server": None, "opened": False, "stack": stack, "watched": watched}


# The test servers follow one run directory as `tilescope-app --watch DIR` does (TILESCOPE_WATCH),
# absent until test_browser_watch grows a run there (and removed after it): a watched directory
# without a run is not listed, so the other pages see the bundled data/ only.
WATCHED_RUN = "growing-job"


def _start_server(stack: ExitStack, tmp_path_factory, watched: Path):
    from app.devtools import running_app
    from tests.app.live_app import ROOT

    log = tmp_path_factory.mktemp("streamlit_log") / "streamlit.log"
    env = {**TEST_SERVER_ENV, "TILESCOPE_WATCH": str(watched)}
    return stack.enter_context(running_app(ROOT / "data", log, env=env))


# The browser tests' servers skip Streamlit's full garbage collection after every script run
# (runner.postScriptGC, on by default to keep a long-lived server's memory down): over a heap
# holding torch, Triton, plotly and pandas each gc.collect(2) is ~0.2 s of CPU, ~10% of a test
# server's CPU. Python's own collector still runs; users' servers keep Streamlit's default.
TEST_SERVER_ENV = {"STREAMLIT_RUNNER_POST_SCRIPT_GC": "false"}


def _shared_url(shared: dict, tmp_path_factory) -> str:
    """The shared server's URL, started now if none runs (or the one started before has exited:
    a server left idle while other tests ran can be gone by the time the browser tests come)."""
    server = shared["server"]
    if server is None or server.proc.poll() is not None:
        shared["server"], shared["opened"] = _start_server(shared["stack"], tmp_path_factory, shared["watched"]), False
    return shared["server"].url


@pytest.fixture
def app_server(_shared_server, tmp_path_factory) -> str:
    """The URL of the session's one app server (the bundled data/, interpreter for live runs)."""
    url = _shared_url(_shared_server, tmp_path_factory)
    _shared_server["opened"] = True
    return url


@pytest.fixture
def app_server_http(_shared_server, tmp_path_factory) -> str:
    """The shared server's URL for plain HTTP requests (no page session is opened on it, so it
    stays fresh for `fresh_app_server`)."""
    return _shared_url(_shared_server, tmp_path_factory)


@pytest.fixture
def fresh_app_server(_shared_server, tmp_path_factory):
    """A server no session has used yet. The shared one when no page has been opened on it (the
    tests asking for this run first among the browser tests), else one started for this test alone."""
    url = _shared_url(_shared_server, tmp_path_factory)
    if not _shared_server["opened"]:
        _shared_server["opened"] = True
        yield url
    else:
        with ExitStack() as own:
            yield _start_server(own, tmp_path_factory, _shared_server["watched"]).url


@pytest.fixture
def watched_app_server(_shared_server, tmp_path_factory):
    """(the shared server's URL, the run directory it watches): the directory is absent; a test
    that makes a run there has it removed afterwards."""
    import shutil

    url = _shared_url(_shared_server, tmp_path_factory)
    _shared_server["opened"] = True
    try:
        yield url, _shared_server["watched"]
    finally:
        shutil.rmtree(_shared_server["watched"], ignore_errors=True)
