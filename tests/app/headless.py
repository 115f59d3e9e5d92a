"""One set of helpers for the headless (AppTest) app tests: open a page with query parameters,
read its charts' data back, point the app at a data directory, record a small trace here.

The fixtures built on these (the shared recordings, `data_dir`) are in tests/app/conftest.py.
"""

from __future__ import annotations

import base64
import functools
import html
import io
import json
import os
import re
import shutil
import zipfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from app.browser import find_browser, missing_reason
from app.export.common import IMAGE_NEEDS
from tests.app.conftest import N

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


def decode(spec: str, arrays: bool = False):
    """A Plotly JSON spec parsed, its typed arrays ({'dtype', 'bdata', 'shape'}) decoded: to lists,
    or to numpy arrays (dtype kept) with arrays=True. Decoded as the parser meets each object
    (json's object_hook), not by a walk over the parsed figure afterwards, which visited each of a
    large map's hover strings one by one."""
    def typed(obj: dict):
        if "bdata" in obj and "dtype" in obj:
            arr = np.frombuffer(base64.b64decode(obj["bdata"]), dtype=obj["dtype"])
            if obj.get("shape"):
                arr = arr.reshape([int(x) for x in str(obj["shape"]).split(",")])
            return arr if arrays else arr.tolist()
        return obj

    return json.loads(spec, object_hook=typed)


def charts(at, arrays: bool = False) -> list[dict]:
    """Every Plotly chart on the page, as its figure dict with data decoded; not the hidden empty
    chart that starts the browser loading Plotly (app/plotly_preload.py): a page that stops before
    the end of its first run leaves it there until the next run."""
    from app.plotly_preload import KEY

    return [decode(el.proto.spec, arrays) for el in at.get("plotly_chart") if KEY not in el.proto.id]


def chart(at, needle: str, arrays: bool = False) -> dict:
    """The first chart whose title contains `needle`."""
    return next(c for c in charts(at, arrays) if needle in c["layout"]["title"]["text"])


def titles(at) -> list[str]:
    return [c["layout"].get("title", {}).get("text", "") for c in charts(at)]


def clean(at) -> None:
    """No exception element and no error message on the page."""
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


# -- the app on the shared small recordings (the `data_dir` fixture) ----------------------------

PAGES = ("schedule", "block_skip", "online_softmax", "memory")


def app(data_dir, **query):
    """A new session on a link with these query parameters, run once (data_dir: the fixture,
    which points the app at the shared recordings)."""
    return open_page(timeout=90, **query)


def live(data_dir, page="schedule", **query):
    base = dict(page=page, source="interpreter", seq_len=N, head_dim=32, block_m=64, block_n=64,
                dtype="fp16")
    return app(data_dir, **{**base, **query})


def run_clicked(at):
    """Press the sidebar's Run button (live sources apply control changes only then)."""
    return at.button(key="ctl_run").click().run()


def table_with(at, column):
    return next(d.value for d in at.dataframe if column in d.value.columns)


def share_link_shown(at) -> str:
    """The link in the sidebar's read-only link field (plain HTML: no st.code highlighting)."""
    box = next(h.proto.body for h in at.sidebar.get("html") if "tilescope-link" in h.proto.body)
    return html.unescape(re.search(r'value="([^"]*)"', box).group(1))


needs_chromium = pytest.mark.skipif(find_browser() is None, reason=str(missing_reason(IMAGE_NEEDS)))


@functools.lru_cache(maxsize=256)
def random_png(w: int, h: int, seed: int) -> bytes:
    """A w x h PNG of flat blocks in a few dozen colours (a stand-in for a kaleido frame: a chart
    is flat fills, and per-pixel noise makes the GIF palette search minutes long). Every seed
    draws the same 9 x 16 blocks but one, as a chart's frames differ from one another in a few
    places: frames from different seeds differ, and H.264 encodes the unchanged blocks almost for
    nothing (all blocks new in every frame cost the videos' encoder twice the CPU). Made once
    per (w, h, seed) in a process, at zlib level 1 (the default level took twice the CPU to
    write and to read back; the stand-in frames only need to be valid PNGs of that size)."""
    import imageio.v3 as iio

    base = np.random.default_rng(0)
    colours = base.integers(0, 255, (32, 3), dtype=np.uint8)
    which = base.integers(0, 32, (9, 16))
    cell = seed % 9, seed // 9 % 16                                    # this seed's block: another colour
    which[cell] = (which[cell] + 1 + np.random.default_rng(seed).integers(0, 31)) % 32
    cells = colours[which]                                             # (9, 16, 3) blocks
    img = np.repeat(np.repeat(cells, -(-h // 9), axis=0), -(-w // 16), axis=1)[:h, :w]
    return iio.imwrite("<bytes>", np.ascontiguousarray(img), extension=".png", compress_level=1)


HOST = "198.51.100.7"      # a documentation address: nothing may ever be fetched from it
LINK = re.compile(r"(?<!\\)\]\(|https?://")      # a Markdown link or a bare URL in shown text
HOSTILE = {  # name: (edit of the manifest, fragment of the one-line answer)
    "etc-passwd": (lambda m: m["tables"]["rows"].update(file="/etc/passwd"), "outside the trace"),
    "dotdot": (lambda m: m["tables"]["rows"].update(file="../../../../etc/passwd"), "outside the trace"),
    "dev-zero": (lambda m: m["tables"]["work"].update(file="/dev/zero"), "outside the trace"),
    "no-meta": (lambda m: m.pop("meta"), "'meta' is a required property"),
    "tables-list": (lambda m: m.update(tables=[1]), "tables: [1] is not of type 'object'"),
    "shape-big": (lambda m: m["meta"].update(shape="big"), "shape: 'big' is not of type 'object'"),
    "n-99999": (lambda m: m["meta"]["shape"].update(N=99999, N_q=99999), "contradicts its tables"),
    "html-device": (lambda m: m["meta"].update(device_name=f"<a href=http://{HOST}>GPU</a>"),
                    "device_name"),
}


def hostile_dir(good: Path, tmp: Path, name: str) -> Path:
    """A copy of the trace directory `good` with its manifest edited as HOSTILE[name] says."""
    out = tmp / name / "trace"
    shutil.copytree(good, out)
    m = json.loads((out / "manifest.json").read_text())
    HOSTILE[name][0](m)
    (out / "manifest.json").write_text(json.dumps(m))
    return out


def captions(at) -> str:
    """The sidebar's captions as one string."""
    return " ".join(c.value for c in at.sidebar.caption)


def live_block_skip(**query):
    """The block-skip page on a live interpreter source (N=256, causal, 64x64 blocks unless given)."""
    base = dict(source="interpreter", seq_len=256, head_dim=32, block_m=64, block_n=64, dtype="fp16",
                mask="causal")
    return open_page("block_skip", timeout=120, **{**base, **query})
