"""What every view shares: the provenance banner, charts with export buttons (through
app.export), trace downloads, and turning a failed source into a visible message (never a
traceback).
"""

from __future__ import annotations

import io
import json
import tempfile
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import plotly.graph_objects as go
import streamlit as st
from plotly.basedatatypes import BaseFigure

from app import export, sidebar
from app.figures import presentation as slide_style
from app.settings import Settings
from app.sources import RunError, Source, current_source
from app.text import plain

MIME = {"png": "image/png", "svg": "image/svg+xml", "pdf": "application/pdf", "html": "text/html", "gif": "image/gif",
        "mp4": "video/mp4", "zip": "application/zip", "json": "application/json"}


# -- sources ------------------------------------------------------------------------------------

def source_or_stop(s: Settings) -> Source:
    """The settings' trace, or a visible error (with a way out) and the page stops there."""
    try:
        src = current_source(s)
    except RunError as exc:
        explain_failure(exc, s)
        st.stop()
    name_downloads(src)
    return src


def name_downloads(source_or_stem) -> None:
    """Name this page run's downloads after its recording (app.export.recording_stem): a Source,
    a Trace or a stem. main.py forgets the name before each page, so no page inherits another's."""
    st.session_state["_download_stem"] = export.recording_stem(source_or_stem)


def download_name(view: str, fmt: str) -> str:
    """The current recording's download name for `view` (app.export.download_name)."""
    return export.download_name(st.session_state.get("_download_stem"), view, fmt)


def explain_failure(exc: RunError, s: Settings, shown: Settings | None = None) -> None:
    """The refusal as one error line (with `shown`: the view below is that earlier one), and the
    ways out it offers (the nearest recording, scaling the document lengths)."""
    kept = f" Nothing ran; the view below is the last one that did ({shown.brief()})." if shown else ""
    st.error(plain(f"{exc}{kept}"), icon=":material/error:")
    if exc.nearest is not None:
        kind = "GPU recording" if exc.nearest.is_gpu else "recording"
        st.button(f"Open the nearest bundled {kind}: {plain(exc.nearest.label)}",
                  on_click=sidebar.open_recording, args=(exc.nearest.name,), key="open_nearest",
                  type="primary")
    elif "interpreter stops at" in str(exc):
        st.info("No recording is bundled on this machine (data/traces/ is empty), so there "
                "is nothing nearer to offer: lower N or raise the block sizes.")
    if s.mask_text.startswith("document:") and "sum to" in str(exc):
        st.button("Scale the document lengths to N", on_click=sidebar.scale_docs_to_n,
                  key="scale_docs")


# -- provenance banner --------------------------------------------------------------------------

def banner(src: Source) -> None:
    """Where the data on this page came from: device, backend, date, versions (not on slides:
    there every chart's own caption says where its data came from)."""
    if st.session_state.get("ctl_present"):
        return
    m = src.trace.meta
    versions = ", ".join(f"{k} {m[v]}" for k, v in (("torch", "torch_version"), ("triton", "triton_version"),
                                                     ("CUDA", "cuda_version"), ("driver", "driver_version"),
                                                     ("Python", "python_version")) if m.get(v))
    hw = (f"{m.get('sm_count')} SMs, compute capability {m.get('compute_capability')}"
          if m.get("backend") == "cuda" else "no hardware clocks")
    timing = (f" · kernel {m['untraced_ms']:.3f} ms untraced, {m['traced_ms']:.3f} ms traced"
              if m.get("untraced_ms") is not None and m.get("traced_ms") is not None else "")
    ran = f" · ran in {src.run_s:.2f} s" if src.run_s is not None else ""
    sh = m.get("shape", {})   # the problem's real shape (GQA: H query heads read H_kv KV heads)
    shape = " · ".join(f"{k} {sh[k]}" for k in ("B", "H", "H_kv", "N_q", "N_k", "D") if k in sh)
    dtype = str(m.get("dtype"))
    if m.get("precision") == "fp8":     # the inputs' dtype; the kernel ran on their e4m3 quantisation
        fp8 = m.get("fp8") if isinstance(m.get("fp8"), dict) else {}
        dtype = (f"{dtype} inputs, FP8 e4m3 kernel ({fp8.get('scaling', '?')} scales"
                 f"{' + Hadamard' if fp8.get('hadamard') else ''})")
    st.info(f"**Data: {plain(src.origin)}** · {plain(src.trace.provenance())}  \n"
            + (f"**Shape:** {plain(shape)} · {plain(dtype)} · mask {plain(str(m.get('mask')))}  \n"
               if shape else "")
            + plain(f"backend {m.get('backend')} · {m.get('device_name')} ({hw}) · recorded "
                    f"{when(m.get('created'))} · {versions}{timing}{ran}"), icon=":material/info:")


def when(created) -> str:
    """A trace's ISO time stamp as people read it: '2026-11-21 22:50 UTC' (as given when it is
    not one)."""
    try:
        t = datetime.fromisoformat(str(created))
    except ValueError:
        return str(created if created is not None else "?")
    if t.tzinfo is not None:
        t = t.astimezone(timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M") + (" UTC" if t.tzinfo is not None else "")


# -- charts and exports ---------------------------------------------------------------------------

def metric_columns(n: int, present: bool) -> list:
    """n places for a row of st.metric. Slides hide metrics, but a row of hidden columns still takes
    the page's gap and pushed the first slide's export row off a 1280 x 720 window: on slides the n
    share one hidden placeholder."""
    return [st.empty()] * n if present else st.columns(n)


def presentation(fig: go.Figure) -> go.Figure:
    return slide_style(fig)          # the slide template sizes margins to titles and captions


def figure_bytes(fig: go.Figure, fmt: str) -> bytes:
    """PNG / SVG / PDF (kaleido) or standalone HTML of a figure, as app.export writes them."""
    return export.figure_bytes(fig, fmt)


def _as_shown(fig: go.Figure, present: bool) -> go.Figure:
    """The figure in the page's look: on slides at its slide size, fixed (app/presentation.py
    scales it to the window)."""
    if present:
        fig = presentation(fig)
        slide_px = [int(fig.layout.width or 1280), int(fig.layout.height or 720)]
        meta = dict(fig.layout.meta) if isinstance(fig.layout.meta, dict) else {}
        fig.update_layout(autosize=False, width=slide_px[0], height=slide_px[1],
                          meta={**meta, "slide_px": slide_px})
    return fig


class _Sent(BaseFigure):
    """What st.plotly_chart is given for a figure: only its dict (_sent; for a cached figure made
    once, _sent_once): st.plotly_chart reads nothing but to_dict of a figure."""

    def __init__(self, sent: dict):          # no BaseFigure.__init__: nothing to validate or copy
        object.__setattr__(self, "_sent", sent)

    def to_dict(self) -> dict:
        return self._sent


def _plain(obj):
    """obj with its dicts, lists and tuples copied, the values in them shared."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_plain(v) for v in obj)
    return obj


def _sent(fig: go.Figure) -> _Sent:
    """The figure's dict as st.plotly_chart sends it: Figure.to_dict's result (data, layout and
    frames as plain dicts, numpy arrays as base64 typed arrays) without its deep copy of every
    array, which the typed-array step copies again anyway (plotly's convert_to_base64 replaces an
    array in a dict by a new one and changes nothing else but the copied dicts)."""
    from _plotly_utils.utils import convert_to_base64

    sent = {"data": _plain(fig._data), "layout": _plain(fig._layout)}
    frames = _plain([frame._props for frame in fig._frame_objs])
    if frames:
        sent["frames"] = frames
    convert_to_base64(sent)
    return _Sent(sent)


def _sent_once(fig: go.Figure) -> _Sent:
    """A cached figure's dict as st.plotly_chart sends it (_sent: a copy of the whole figure,
    frames included, and a walk of it for typed arrays), made at its first chart and kept while
    the figure lives: every rerun sent it again, ~0.3 s of CPU for an online-softmax row of 256
    steps (its frames), half of a step on the server. Kept on the figure (figures are not hashable)."""
    sent = fig.__dict__.get("_sent_once")
    if sent is None:
        sent = _sent(fig)
        object.__setattr__(fig, "_sent_once", sent)
    return sent


def chart(fig: go.Figure, name: str, key: str, present: bool, exports=("png", "svg", "pdf", "html"),
          exported=None, cached: bool = False) -> None:
    """A Plotly chart as the page shows it, with its download buttons underneath.

    Arguments: the figure, its export name, the element key, the slide look or not, the export
    formats; exported: what the buttons export instead of `fig`, a figure or a callable that
    returns one when a button is clicked (the online-softmax page's charts step in the browser:
    they export the figure at the server's step, not their frames); cached: `fig` is a cached
    figure that nothing changes after it is first shown (a st.cache_resource function's), so
    what is sent for it is made once (_sent_once), not at every rerun."""
    fig = _as_shown(fig, present)
    size = dict(width="content", height=int(fig.layout.height or 720)) if present else {}
    st.plotly_chart(_sent_once(fig) if cached else _sent(fig), key=key, theme=None, config={"displaylogo": False},
                    **size)
    if exported is not None:
        fig = _deferred(lambda: _as_shown(exported() if callable(exported) else exported, present))
    if exports:
        export.warm_renderer_in_background()     # an export click then renders at once, no browser start
        # one small menu per chart: its buttons are drawn by the browser only when it opens (a
        # page of charts otherwise paints four buttons per chart before it settles)
        with st.popover(f"⬇ Export chart ({' · '.join(f.upper() for f in exports)})", width="content",
                        key=f"{key}_export"):
            for fmt in exports:
                st.download_button(f"⬇ {fmt.upper()}", data=_deferred(_figure_bytes, fig, fmt),
                                   file_name=download_name(name, fmt), mime=MIME[fmt], key=f"{key}_{fmt}",
                                   on_click="ignore", width="stretch",
                                   help=f"{name} as {fmt.upper()} ({'kaleido' if fmt != 'html' else 'standalone, works offline'})")


def _deferred(fn, *args):
    """Data for a download button, produced only when the button is clicked."""
    def produce():
        return fn(*args)
    return produce


def _figure_bytes(fig, fmt: str) -> bytes:
    """figure_bytes of a figure, or of what a _deferred figure produces (at the click)."""
    return figure_bytes(fig() if callable(fig) else fig, fmt)


def animation_bytes(trace, fmt: str, tl=None, present: bool = False) -> bytes:
    """GIF / MP4 of the animation; present=True: the slide look at 1920 x 1080."""
    with tempfile.TemporaryDirectory() as tmp:
        return export.export_animation(trace, Path(tmp) / f"schedule.{fmt}", fmt, tl=tl,
                                       presentation=present).read_bytes()


def chrome_trace_bytes(trace, tl) -> bytes:
    return export.chrome_trace_bytes(trace, tl)


def trace_zip(trace, fmt: str) -> bytes:
    """The trace as a zip: 'parquet' is Trace.save's directory (uploadable back into the app),
    'csv' is one CSV per table plus meta.json."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        if fmt == "parquet":
            with tempfile.TemporaryDirectory() as tmp:
                root = trace.save(Path(tmp) / "trace")
                for f in sorted(root.iterdir()):
                    zf.write(f, f"trace/{f.name}")
        else:
            for name in ("work", "tiles", "rows", "out"):
                zf.writestr(f"trace/{name}.csv", getattr(trace, name).to_csv(index=False))
            for name in ("bwd_work", "bwd_tiles", "bwd_rows", "fp8_error"):     # the backward's; FP8 errors
                table = getattr(trace, name, None)
                if table is not None and len(table):
                    zf.writestr(f"trace/{name}.csv", table.to_csv(index=False))
            zf.writestr("trace/meta.json", json.dumps(trace.meta, indent=1, default=str))
    return buf.getvalue()


def trace_downloads(trace, key: str, tl=None) -> None:
    """Download buttons for the trace tables (and the schedule as Chrome-trace JSON)."""
    what = "parquet · CSV" + (" · Chrome trace" if tl is not None else "")
    with st.popover(f"⬇ Trace data ({what})", width="content", key=f"{key}_data"):   # drawn when opened, as chart exports
        st.download_button("⬇ trace (parquet zip)", data=_deferred(trace_zip, trace, "parquet"),
                           file_name=download_name("trace", "zip"), mime=MIME["zip"], key=f"{key}_parquet",
                           on_click="ignore", width="stretch",
                           help="Trace.save's directory, zipped: upload it back here")
        st.download_button("⬇ trace (CSV zip)", data=_deferred(trace_zip, trace, "csv"),
                           file_name=download_name("trace-csv", "zip"), mime=MIME["zip"], key=f"{key}_csv",
                           on_click="ignore", width="stretch", help="one CSV per table, and meta.json")
        if tl is not None:
            st.download_button("⬇ schedule (Chrome trace JSON)", data=_deferred(chrome_trace_bytes, trace, tl),
                               file_name=download_name("schedule-chrome-trace", "json"), mime=MIME["json"],
                               key=f"{key}_chrome", on_click="ignore", width="stretch",
                               help="open in https://ui.perfetto.dev or chrome://tracing")


# -- a page's own recordings (ring, serving): traces loaded once per directory and manifest mtime --

@st.cache_resource(show_spinner=False, max_entries=16)
def _trace_at(path: str, mtime: float):
    from instrumentation.trace import Trace

    return Trace.load(path)


def trace_dir(path):
    """The trace in directory `path`, cached until its manifest.json changes. Raises TraceFormatError."""
    return _trace_at(str(path), Path(path, "manifest.json").stat().st_mtime)


# -- caches of things derived from a trace (keyed on Source.key; the trace itself is not hashed) --

@st.cache_resource(show_spinner=False, max_entries=32)
def timeline_for(key: str, sms: int | None, _trace):
    from instrumentation.analysis.schedule_model import timeline

    return timeline(_trace, sms=sms)


@st.cache_resource(show_spinner=False, max_entries=16)
def animation_for(key: str, sms: int | None, max_frames: int, _trace, _tl):
    from app.figures.schedule_animation import tile_animation_figure

    return tile_animation_figure(_trace, _tl, max_frames=max_frames)
