"""What every page shares: the provenance banner, charts with export buttons, trace downloads,
and turning a failed source into a visible message (never a traceback).

Exports prefer app/export.py (export_figure, export_animation, chrome_trace, presentation);
while a helper is missing there, a small local fallback below does the same job.
"""

from __future__ import annotations

import io
import json
import tempfile
import zipfile
from pathlib import Path

import plotly.graph_objects as go
import streamlit as st

from app import state

try:  # the export helpers of app/export.py (another engineer's module)
    from app import export as _export
except Exception:  # pragma: no cover - before app/export.py lands
    _export = None

MIME = {"png": "image/png", "svg": "image/svg+xml", "html": "text/html", "gif": "image/gif",
        "mp4": "video/mp4", "zip": "application/zip", "json": "application/json"}


# -- sources ------------------------------------------------------------------------------------

def source_or_stop(s: state.Settings) -> state.Source:
    """The settings' trace, or a visible error (with a way out) and the page stops there."""
    try:
        return state.current_source(s)
    except state.RunError as exc:
        explain_failure(exc, s)
        st.stop()


def explain_failure(exc: state.RunError, s: state.Settings) -> None:
    st.error(str(exc), icon=":material/error:")
    if exc.nearest is not None:
        kind = "GPU recording" if exc.nearest.is_gpu else "recording"
        st.button(f"Open the nearest bundled {kind}: {exc.nearest.label}",
                  on_click=state.open_recording, args=(exc.nearest.name,), key="open_nearest",
                  type="primary")
    elif "interpreter stops at" in str(exc):
        st.info("No recording is bundled on this machine (data/traces/ is empty), so there "
                "is nothing nearer to offer: lower N or raise the block sizes.")
    if s.mask.startswith("document:") and "sum to" in str(exc):
        st.button("Scale the document lengths to N", on_click=state.scale_docs_to_n,
                  key="scale_docs")


# -- provenance banner --------------------------------------------------------------------------

def banner(src: state.Source) -> None:
    """Where the data on this page came from: device, backend, date, versions."""
    m = src.trace.meta
    versions = ", ".join(f"{k} {m[v]}" for k, v in (("torch", "torch_version"), ("triton", "triton_version"),
                                                     ("CUDA", "cuda_version"), ("driver", "driver_version"),
                                                     ("Python", "python_version")) if m.get(v))
    hw = (f"{m.get('sm_count')} SMs, compute capability {m.get('compute_capability')}"
          if m.get("backend") == "cuda" else "no hardware clocks")
    timing = (f" · kernel {m['untraced_ms']:.3f} ms untraced, {m['traced_ms']:.3f} ms traced"
              if m.get("untraced_ms") is not None and m.get("traced_ms") is not None else "")
    ran = f" · ran in {src.run_s:.2f} s" if src.run_s is not None else ""
    st.info(f"**Data: {src.origin}** · {src.trace.provenance()}  \n"
            f"backend `{m.get('backend')}` · {m.get('device_name')} ({hw}) · recorded "
            f"{m.get('created', '?')} · {versions}{timing}{ran}", icon=":material/info:")


# -- charts and exports ---------------------------------------------------------------------------

def presentation(fig: go.Figure) -> go.Figure:
    try:
        from app.figures import presentation as styled
    except ImportError:  # pragma: no cover
        styled = None
    if styled is not None:
        fig = styled(fig)
        # larger title fonts need a taller top margin, or the title runs into the plot
        top = fig.layout.margin.t if fig.layout.margin.t is not None else 100
        fig.update_layout(margin=dict(t=max(top, 150)))
        fig.update_yaxes(automargin=True)
        return fig
    fig = go.Figure(fig)  # local fallback: larger fonts, light background, no clutter
    fig.update_layout(template="plotly_white", font=dict(size=20), paper_bgcolor="white",
                      plot_bgcolor="white", hoverlabel=dict(font_size=18))
    return fig


def figure_bytes(fig: go.Figure, fmt: str) -> bytes:
    """PNG / SVG (kaleido) or standalone HTML of a figure."""
    if _export is not None and hasattr(_export, "export_figure"):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"figure.{fmt}"
            _export.export_figure(fig, path, fmt)
            return path.read_bytes()
    if fmt == "html":
        return fig.to_html(include_plotlyjs=True, full_html=True).encode()
    return fig.to_image(format=fmt, scale=2 if fmt == "png" else 1)


def chart(fig: go.Figure, name: str, key: str, present: bool, exports=("png", "svg", "html")) -> None:
    """A Plotly chart as the page shows it, with its download buttons underneath."""
    if present:
        fig = presentation(fig)
    st.plotly_chart(fig, key=key, theme=None, config={"displaylogo": False})
    if exports:
        cols = st.columns([1] * len(exports) + [8 - len(exports)])
        for col, fmt in zip(cols, exports):
            col.download_button(f"⬇ {fmt.upper()}", data=_deferred(figure_bytes, fig, fmt),
                                file_name=f"{name}.{fmt}", mime=MIME[fmt], key=f"{key}_{fmt}",
                                on_click="ignore",
                                help=f"{name} as {fmt.upper()} ({'kaleido' if fmt != 'html' else 'standalone, works offline'})")


def _deferred(fn, *args):
    """Data for a download button, produced only when the button is clicked."""
    def produce():
        return fn(*args)
    return produce


def animation_bytes(trace, fmt: str, tl=None) -> bytes:
    if _export is None or not hasattr(_export, "export_animation"):
        raise RuntimeError("animation export needs app/export.py's export_animation")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"schedule.{fmt}"
        _export.export_animation(trace, path, fmt, tl=tl)
        return path.read_bytes()


def chrome_trace_bytes(trace, tl) -> bytes:
    if _export is not None and hasattr(_export, "chrome_trace"):
        doc = _export.chrome_trace(trace, tl)
    else:
        doc = _local_chrome_trace(trace, tl)
    if isinstance(doc, bytes):
        return doc
    return (doc if isinstance(doc, str) else json.dumps(doc)).encode()


def _local_chrome_trace(trace, tl) -> dict:
    """Chrome trace-event JSON (Perfetto): one complete event per work item on its SM lane."""
    modelled = bool(tl["modelled"].any())
    scale = 1.0 if modelled else 1e-3          # ts/dur are µs; modelled tile-units shown as µs
    events = [{"name": f"bh{int(r.bh)} q{int(r.q_block)}", "ph": "X", "pid": 0, "tid": int(r.sm),
               "ts": float(r.t_start) * scale, "dur": float(r.t_end - r.t_start) * scale,
               "args": {"tiles_visited": int(r.tiles_visited)}} for r in tl.itertuples()]
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"provenance": trace.provenance(), "modelled": modelled,
                          "unit": "tile-units as µs" if modelled else "µs"}}


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
            zf.writestr("trace/meta.json", json.dumps(trace.meta, indent=1, default=str))
    return buf.getvalue()


def trace_downloads(trace, key: str, tl=None) -> None:
    """Download buttons for the trace tables (and the schedule as Chrome-trace JSON)."""
    cols = st.columns([2, 2, 3, 3])
    cols[0].download_button("⬇ trace (parquet zip)", data=_deferred(trace_zip, trace, "parquet"),
                            file_name="tilescope-trace.zip", mime=MIME["zip"], key=f"{key}_parquet",
                            on_click="ignore", help="Trace.save's directory, zipped: upload it back here")
    cols[1].download_button("⬇ trace (CSV zip)", data=_deferred(trace_zip, trace, "csv"),
                            file_name="tilescope-trace-csv.zip", mime=MIME["zip"], key=f"{key}_csv",
                            on_click="ignore")
    if tl is not None:
        cols[2].download_button("⬇ schedule (Chrome trace JSON)", data=_deferred(chrome_trace_bytes, trace, tl),
                                file_name="tilescope-schedule.json", mime=MIME["json"],
                                key=f"{key}_chrome", on_click="ignore",
                                help="open in https://ui.perfetto.dev or chrome://tracing")


def settings_caption(s: state.Settings) -> str:
    return (f"N={s.seq_len} · mask {s.mask} · D={s.head_dim} · blocks {s.block_m}×{s.block_n} · "
            f"{s.dtype} · B×H={s.batch}×{s.heads} · schedule {s.schedule}")


# -- caches of things derived from a trace (keyed on Source.key; the trace itself is not hashed) --

@st.cache_resource(show_spinner=False, max_entries=32)
def timeline_for(key: str, sms: int | None, _trace):
    from instrumentation.schedule_model import timeline

    return timeline(_trace, sms=sms)


@st.cache_resource(show_spinner=False, max_entries=16)
def animation_for(key: str, sms: int | None, max_frames: int, _trace, _tl):
    from app.figures.schedule import tile_animation_figure

    return tile_animation_figure(_trace, _tl, max_frames=max_frames)
