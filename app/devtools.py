"""Developer tools shared by the browser tests (tests/app/live_app.py) and the app timing script
(scripts/measure_app.py): `streamlit run app/main.py` as a subprocess on a free port,
health-checked and stopped on exit, and Chromium's launch settings (the browser itself is the one
app.browser.find_browser finds). Nothing here is imported by the app itself, and nothing downloads
a browser.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# New headless Chromium builds the omnibox's WebUI popup for every new window (each Playwright
# context): ~1.2 s of a second renderer's CPU (chrome://omnibox-popup.top-chrome, traced on this
# 2-CPU machine) during the page load being timed, which a person's browser spent once, long
# before. Turned off here; one --disable-features switch wins over another, so the list repeats
# the features Playwright itself turns off.
_PLAYWRIGHT_OFF = ("AvoidUnnecessaryBeforeUnloadCheckSync,DestroyProfileOnBrowserClose,HttpsUpgrades,"
                   "HttpsFirstBalancedModeAutoEnable,LensOverlay,MediaRouter,PaintHolding,"
                   "ThirdPartyStoragePartitioning,AvoidCorsURLLoaderRestartOnRedirect,OptimizationHints,"
                   "NetworkTimeServiceQuerying,AimEnabled,PreconnectToSearch")
_BROWSER_UI_OFF = "WebUIOmniboxPopup,WebUIOmniboxFullPopup,WebUIOmniboxAimPopup,PreloadTopChromeWebUI"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 f"--disable-features={_PLAYWRIGHT_OFF},{_BROWSER_UI_OFF}"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen | None = None, timeout: float = 90) -> None:
    """Until `url`/_stcore/health answers ok (or `proc` exits, or `timeout` s pass)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200 and r.read().strip() == b"ok":
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not become healthy within {timeout} s")


@dataclass
class Server:
    url: str
    healthy_after_s: float          # from starting the process to the first healthy answer
    proc: subprocess.Popen


@contextmanager
def running_app(data_dir: Path | None, log_path: Path | None, app: str | Path = "app/main.py",
                interpreter: bool = True, env: dict | None = None, cwd: Path | None = None):
    """`streamlit run app` served on 127.0.0.1 (recordings from `data_dir`, or the app's default
    data/ when None; TRITON_INTERPRET=1 unless interpreter=False; `env` added to the server's
    environment; run in `cwd`, default this checkout: another checkout's app must run in its own,
    since Streamlit puts the working directory on the import path first); yields a Server."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false", "PYTHONPATH": str(ROOT), **(env or {})}
    if interpreter:
        env["TRITON_INTERPRET"] = "1"
    if data_dir is not None:
        env["TILESCOPE_DATA"] = str(data_dir)
    with open(log_path or os.devnull, "w") as log:
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(app), "--server.headless", "true",
             "--server.port", str(port), "--server.address", "127.0.0.1",
             "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
            cwd=cwd or ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(url, proc)
            yield Server(url, time.perf_counter() - started, proc)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)


@contextmanager
def streamlit_server(data_dir: Path | None, log_path: Path | None):
    """The app (interpreter kernels, recordings from `data_dir`); yields its URL."""
    with running_app(data_dir, log_path) as server:
        yield server.url
