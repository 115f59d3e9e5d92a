"""One implementation of what the browser tests share: `streamlit run app/main.py` as a
subprocess on a free port (health-checked, stopped on exit), the system Chromium's launch
settings, and small Playwright waits. The session-wide server and Chromium built on these are
fixtures in tests/app/conftest.py. Never downloads a browser.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


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


@contextmanager
def streamlit_server(data_dir: Path | None, log_path: Path):
    """The app served on 127.0.0.1 (interpreter kernels, recordings from `data_dir`, or the
    app's default data/ when None); yields its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TRITON_INTERPRET": "1", "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false",
           "PYTHONPATH": str(ROOT)}
    if data_dir is not None:
        env["TILESCOPE_DATA"] = str(data_dir)
    with open(log_path, "w") as log:
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


def chart_titles(page) -> list[str]:
    return page.locator(".js-plotly-plot .gtitle").all_text_contents()


def wait_for_title(page, needle: str, timeout: float = 60_000) -> None:
    """Until a chart whose title contains `needle` is drawn."""
    page.wait_for_function(
        "needle => [...document.querySelectorAll('.js-plotly-plot .gtitle')]"
        ".some(t => t.textContent.includes(needle))", arg=needle, timeout=timeout)


def no_exception_on_page(page) -> None:
    assert page.locator('[data-testid="stException"]').count() == 0
