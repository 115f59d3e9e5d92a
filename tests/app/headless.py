"""One set of helpers for the headless (AppTest) app tests: open a page with query parameters,
read its charts' data back, point the app at a data directory, record a small trace here.

The fixtures built on these (the shared recordings, `data_dir`) are in tests/app/conftest.py.
"""

from __future__ import annotations

import base64
import io
import json
import os
import zipfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app" / "main.py")


def open_page(page: str | None = None, *, timeout: float = 120, run: bool = True, **query) -> AppTest:
    """The app in a new session opened on a link with these query parameters (values as
    strings, as a browser sends them), run once unless run=False."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    if page is not None:
        query = {"page": page, **query}
    at.query_params.update({k: str(v) for k, v in query.items()})
    return at.run() if run else at


@contextmanager
def tilescope_data(root: Path):
    """TILESCOPE_DATA (where the app reads recordings) set to `root` for the block, then restored."""
    old = os.environ.get("TILESCOPE_DATA")
    os.environ["TILESCOPE_DATA"] = str(root)
    try:
        yield root
    finally:
        if old is None:
            os.environ.pop("TILESCOPE_DATA", None)
        else:
            os.environ["TILESCOPE_DATA"] = old


def record_small(root: Path, name: str, n=256, mask="causal", schedule="natural", bm=64, bn=64, b=1, h=1,
                 d=32, seed=0, **record_args) -> Path:
    """A small recording made here in the interpreter, saved as data/traces/<name> under `root`."""
    from instrumentation import make_inputs, record

    q, k, v = make_inputs(b, h, n, d, "fp16", seed=seed)           # (B, H, N, D)
    _, trace = record(q, k, v, mask=mask, block_m=bm, block_n=bn, schedule=schedule, **record_args)
    trace.meta["source"] = "recorded"
    return trace.save(root / "traces" / name)


def zip_trace(path: Path, folder: str) -> bytes:
    """A trace directory as the zip a user uploads: its files under `folder/`."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for f in sorted(path.iterdir()):
            zf.write(f, f"{folder}/{f.name}")
    return buf.getvalue()


def decode(obj, arrays: bool = False):
    """Plotly JSON with its typed arrays ({'dtype', 'bdata', 'shape'}) decoded: to lists, or to
    numpy arrays (dtype kept) with arrays=True."""
    if isinstance(obj, dict):
        if "bdata" in obj and "dtype" in obj:
            arr = np.frombuffer(base64.b64decode(obj["bdata"]), dtype=obj["dtype"])
            if obj.get("shape"):
                arr = arr.reshape([int(x) for x in str(obj["shape"]).split(",")])
            return arr if arrays else arr.tolist()
        return {k: decode(v, arrays) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v, arrays) for v in obj]
    return obj


def charts(at, arrays: bool = False) -> list[dict]:
    """Every Plotly chart on the page, as its figure dict with data decoded; not the hidden empty
    chart that starts the browser loading Plotly (app/plotly_preload.py): a page that stops before
    the end of its first run leaves it there until the next run."""
    from app.plotly_preload import KEY

    return [decode(json.loads(el.proto.spec), arrays) for el in at.get("plotly_chart") if KEY not in el.proto.id]


def chart(at, needle: str, arrays: bool = False) -> dict:
    """The first chart whose title contains `needle`."""
    return next(c for c in charts(at, arrays) if needle in c["layout"]["title"]["text"])


def titles(at) -> list[str]:
    return [c["layout"].get("title", {}).get("text", "") for c in charts(at)]


def clean(at) -> None:
    """No exception element and no error message on the page."""
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
