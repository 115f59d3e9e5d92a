"""Page: model run. A real model's attention calls, captured by `instrumentation.hf.capture`
during a forward or generate: time and tiles per layer, sliding-window vs global layers, the
prefill and each decode step, the KV cache growing; each prefill call opens in the tile-schedule,
block-skip and online-softmax pages (a `run:<run>:<call>` recording, app/sources/model_run.py).
Opens a bundled run (data/runs/), a growing run written by `instrumentation.watch` (under
data/runs/ or the directory `tilescope-app --watch DIR` follows: its charts refresh in a Streamlit
fragment while it grows, with its live / finished / stopped-updating state) or an uploaded zip of a
run directory. The page's controls live in the URL (mr_* parameters).
"""

from urllib.parse import urlencode

import streamlit as st

from app import settings, url_state, watch_hint
from app.figures._common import fmt_bytes, fmt_time_ms
from app.figures.estimate import short
from app.figures.model_run import (call_table, kv_cache_figure, layer_figure, layer_kind_figure, run_provenance,
                                   steps_figure)
from app.figures.model_run_watch import watch_figure, watch_rate_figure, watch_times
from app.sources import model_run as runs
from app.sources.errors import RunError
from app.text import plain
from app.views import common

UPLOAD = "upload"
# not the online softmax: it regenerates a trace's inputs, and a model's activations are not kept
PAGES_FOR_A_CALL = (("schedule", "tile schedule"), ("block_skip", "block-skip map"))
BACKWARD_PAGE = ("backward", "backward page")     # a watched call traced with backward=True
# a growing run's charts, in the page's order: widget key -> (export file name, figure function)
LIVE_CHARTS = {"mr_watch_rates": ("model-run-watch-rates", watch_rate_figure),
               "mr_watch": ("model-run-watch", watch_figure), "mr_layers": ("model-run-layers", layer_figure),
               "mr_kinds": ("model-run-layer-kinds", layer_kind_figure)}
BACKWARD_STEPS = 3        # the newest traced steps with a backward linked to the Backward page

s = settings.current()
st.title("Model run")
st.caption("A real model's attention, every call of one forward or generate, recorded by "
           "`instrumentation.hf.capture` (transformers, Tilescope's kernels): where the time went by layer, "
           "sliding-window vs global layers, prefill vs decode steps, and the KV cache growing.")

bundled = runs.runs()
options = [r.name for r in bundled] + [UPLOAD]
url_state.control("mr_run", options[0], options=options)
# presentation: the controls fold into the faint "Controls" pill (app/presentation.py): each chart a whole slide
controls = st.expander("Controls", expanded=False, icon=":material/tune:", key="slide_controls") if s.present \
    else st.container()
c = controls.columns([3, 2])
choice = c[0].selectbox("model run", options, key="mr_run",
                        format_func=lambda n: "upload a run (.zip of its directory)" if n == UPLOAD
                        else runs.run_named(n).label)
try:
    if choice == UPLOAD:
        up = c[1].file_uploader("model run (.zip)", type=["zip"], key="mr_upload",
                                help="a zip of the directory ModelRun.save wrote (model_run.json + calls/)")
        if up is None:
            st.info("Upload a zip of a saved model run: `run.save(DIR)` after `with hf.capture(model) as run:`, "
                    "then zip DIR. Saved under data/runs/ it is listed here and its calls link to the other pages.")
            watch_hint.watch_snippet()
            st.stop()
        run, name, shown, info = runs.uploaded_run(up), "", up.name, None
    else:
        info = runs.run_named(choice)
        run, name, shown = (None if info.growing else runs.load_run(info)), choice, choice
except RunError as exc:
    st.error(plain(str(exc)), icon=":material/error:")
    st.stop()
common.name_downloads(name or "model-run")


def backward_links(table, name: str) -> None:
    """For a watched run: the newest traced steps whose calls carry backward tables, each a line of
    links to the Backward page, one per layer (the step's real dL/dO, traced)."""
    bwd = table[table.backward.astype(bool) & (table.phase == "prefill")]
    if not len(bwd):
        st.caption("No traced step of this run has its backward traced: watch with backward=True to open "
                   "one on the Backward page.")
        return
    lines = []
    for step in sorted(set(bwd.step), reverse=True)[:BACKWARD_STEPS]:
        calls = bwd[bwd.step == step].sort_values("layer")
        links = " · ".join(f"[{table.layer_label[i].split(' · ')[0]}](./backward?" + urlencode(
            {"page": "backward", "source": "recorded", "trace": runs.call_name(name, int(i))}) + ")"
            for i in calls["index"])
        lines.append(f"step {int(step)}: {links}")
    st.markdown("**Backward of a traced step** (its real dL/dO), on the Backward page:  \n" + "  \n".join(lines))


@st.cache_resource(show_spinner=False, max_entries=4)
def live_table(path: str, stamp: float, shown_as: str, _run) -> tuple:
    """A growing run's call table and provenance, built once per state of the run on disk (its
    path and stamp): the live fragment re-reads the run every LIVE_EVERY_S seconds and rebuilds
    only when a step has landed (or a marker was written)."""
    return call_table(_run), run_provenance(_run, shown_as)


@st.cache_resource(show_spinner=False, max_entries=4 * 8)
def live_chart(key: str, path: str, stamp: float, _table, _prov: str):
    """One of a growing run's charts (LIVE_CHARTS[key]), built once per state of the run, each on
    its own so the first is on the page before the next is built."""
    return LIVE_CHARTS[key][1](_table, _prov)


def show(run, info) -> None:
    """Everything drawn from the run: its numbers, charts, calls and downloads."""
    if not run.calls:
        st.warning("This model run holds no calls: capture a forward or generate inside `hf.capture(model)`.")
        return
    growing = info is not None and info.growing
    if growing:
        table, prov = live_table(info.path, info.mtime, shown, run)
    else:
        table, prov = call_table(run), run_provenance(run, shown, uploaded=not name)
    m = run.meta
    if not s.present:
        env = m.get("environment") or {}
        st.info(f"**Data: {plain(prov)}**  \n"
                + plain(f"{m.get('about') or m.get('model')} · torch {m.get('torch_version', '?')} · Triton "
                        f"{env.get('triton_version', '?')} · {m.get('command', 'captured from Python')}"),
                icon=":material/info:")
    # -- the run in numbers --------------------------------------------------------------------------------
    prefill, decode = table[table.phase == "prefill"], table[table.phase == "decode"]
    sliding = sorted(set(table.loc[table.kind == "sliding", "layer"]))
    k = common.metric_columns(6, s.present)
    k[0].metric("calls", f"{len(table)}", help="attention calls recorded: layers × forward passes")
    k[1].metric("layers", f"{table.layer.nunique()}", f"{len(sliding)} sliding" if sliding else "global",
                delta_color="off", delta_arrow="off")
    if growing:
        every = (m.get("watched") or {}).get("every")
        k[2].metric("traced steps", f"{table.step.nunique()}", f"every {every}" if every else None,
                    delta_color="off", delta_arrow="off", help="training steps traced so far (and kept)")
    else:
        k[2].metric("forward passes", f"{table.step.nunique()}", f"prefill + {decode.step.nunique()}",
                    delta_color="off", delta_arrow="off")
    k[3].metric("sequence" if growing else "prompt", f"{int(prefill.n_q.max()) if len(prefill) else 0:,} tok",
                help="queries of the prefill calls (N_q)")
    if growing:     # a watched step's calls are traced, not timed: the charts' time of the latest one
        times, measured = watch_times(table)
        latest = times[times.step == times.step.max()]
        k[4].metric("attention", short(fmt_time_ms((latest.fwd_us.sum() + latest.bwd_us.sum()) / 1e3)),
                    f"last step · {'measured' if measured else 'modelled'}", delta_color="off", delta_arrow="off",
                    help="forward and backward attention of the latest traced step, all layers: "
                         + ("measured on the GPU (the traced launches' spans)" if measured else
                            "modelled (instrumentation.estimate): this run has no hardware clock"))
    else:
        k[4].metric("attention", short(fmt_time_ms(table.kernel_us.sum() / 1e3)),
                    help="sum of every call's untraced kernel median (do_bench)")
    last = table[table.step == table.step.max()]
    k[5].metric("KV, last step", short(fmt_bytes(int(last.kv_bytes.sum()), binary=True)),
                help=f"K and V read by the last forward pass, all layers (Estimate.kv_cache_bytes): "
                     f"{int(last.kv_bytes.sum()):,} B")

    # -- charts --------------------------------------------------------------------------------------------
    if growing:    # a training run's traced steps: no decode steps or growing KV cache to draw
        for key, (file, _) in LIVE_CHARTS.items():
            common.chart(live_chart(key, info.path, info.mtime, table, prov), file, key, s.present)
    else:
        common.chart(layer_figure(table, prov), "model-run-layers", "mr_layers", s.present)
        common.chart(layer_kind_figure(table, prov), "model-run-layer-kinds", "mr_kinds", s.present)
        common.chart(steps_figure(table, prov), "model-run-steps", "mr_steps", s.present)
        common.chart(kv_cache_figure(table, prov), "model-run-kv-cache", "mr_kv", s.present)

    # -- one call in the other pages ------------------------------------------------------------------------
    st.subheader("Open a call")
    prefill_calls = [int(i) for i in prefill["index"]]
    if name and prefill_calls:
        if growing:        # the latest traced call, as the run grows
            st.caption(f"Latest traced call: {prefill_calls[-1]} (step {int(table.step[prefill_calls[-1]])}).")
        url_state.control("mr_call", prefill_calls[-1] if growing else prefill_calls[0], int, options=prefill_calls)
        row = st.columns([2, 3])
        pick = row[0].selectbox("prefill call", prefill_calls, key="mr_call",
                                format_func=lambda i: f"call {i} · {table.layer_label[i]} · N_q {table.n_q[i]:,}")
        pages = PAGES_FOR_A_CALL + ((BACKWARD_PAGE,) if bool(table.backward[pick]) else ())
        links = " · ".join(f"[{label}](./{page}?" + urlencode({"page": page, "source": "recorded",
                                                                "trace": runs.call_name(name, pick)}) + ")"
                           for page, label in pages)
        row[1].markdown(f"Open call {pick} in the {links}.  \nDecode steps are split-KV traces: their numbers "
                        "are in the table below, and their tables in the trace download.")
        if growing:
            backward_links(table, name)
    elif not name:
        st.caption("The calls of an uploaded run open here only; saved under data/runs/ (or $TILESCOPE_DATA/runs/), "
                   "each prefill call also opens in the schedule, block-skip and online-softmax pages.")
    table_view = table[["index", "step", "layer", "phase", "n_q", "n_k", "mask", "kernel_us", "tiles", "kv_bytes"]].copy()
    if name:
        table_view["open"] = [("./schedule?" + urlencode({"page": "schedule", "source": "recorded",
                                                         "trace": runs.call_name(name, i)})) if p == "prefill" else ""
                              for i, p in zip(table["index"], table["phase"])]
    st.dataframe(table_view, hide_index=True, width="stretch", height=300,
                 column_config={"index": "call", "kernel_us": st.column_config.NumberColumn("kernel (µs)", format="%.2f"),
                                "kv_bytes": st.column_config.NumberColumn("KV read (B)", format="localized"),
                                "tiles": st.column_config.NumberColumn("tiles", help="Estimate.tiles_computed"),
                                "open": st.column_config.LinkColumn("trace", display_text="schedule",
                                                                    help="a prefill call opens in the tile schedule")})
    row = st.columns([1, 3], vertical_alignment="bottom")
    call = row[0].number_input("call to download", 0, len(run.calls) - 1, 0, key="mr_download_call")
    try:
        with row[1]:
            common.trace_downloads(run.call_trace(int(call)), key="mr_trace")
    except (OSError, ValueError) as exc:          # a trace removed or damaged since the run was listed
        st.error(plain(f"Call {int(call)}'s trace cannot be read: {exc}"), icon=":material/error:")


if info is not None and info.growing:
    def live() -> None:
        """Re-read the growing run and redraw its charts only (the page around stays)."""
        now = runs.fresh(info)
        state = runs.live_status(now)
        icon = {"live": ":material/sensors:", "finished": ":material/check_circle:"}.get(state["state"],
                                                                                      ":material/pause_circle:")
        st.markdown(f"{icon} **{state['text']}**", help="live: a step was written in the last "
                    f"{runs.STALE_AFTER_S // 60} minutes; finished: the watch was closed; stopped updating: "
                    "neither (the job ended without close(), or it is stuck)")
        if not now.calls:
            st.info("No traced step is complete yet: the first one is written when the next step starts.")
            return
        try:
            show(runs.load_run(now), now)
        except RunError as exc:
            st.error(plain(str(exc)), icon=":material/error:")

    # a live run is re-read every LIVE_EVERY_S; one finished or stopped when the page ran, less often
    resting = runs.live_status(info)["state"] in ("finished", "stopped updating")
    st.fragment(live, run_every=runs.RESTING_EVERY_S if resting else runs.LIVE_EVERY_S)()
else:
    show(run, info)
watch_hint.watch_snippet()
