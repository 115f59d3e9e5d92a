"""Page 1: the tile schedule. SM lanes over time, metrics that tell schedules apart, the
stragglers, the whole GPU animated, and up to three schedules side by side.

Everything derived from a trace is computed once (instrumentation.analysis.schedule_analysis memoises
per trace content; the figures are cached per source and options), so a control change only
redraws. The page's own controls live in the URL (app.url_state.control).
"""

import numpy as np
import pandas as pd
import streamlit as st

from app import export, settings, sources, url_state
from app.text import plain
from app.figures.schedule import (COLOR_BY, imbalance_figure, schedule_comparison_figure,
                                  schedule_comparison_stats, sm_lanes_figure)
from app.figures.kv_sharing import kv_sharing_figure
from app.figures.schedule_common import SPREAD_METRICS, spread_is_meaningful, too_few_items_text
from app.figures.schedule_animation import DEFAULT_FRAMES, opening_frame, tile_animation_figure
from app.views import common
from app.views.schedule_video import video_menu
from instrumentation.analysis.schedule_analysis import (METRICS, cached_stats, cached_timeline, default_traced_head,
                                               animation_times, metrics_row, stragglers, traced_heads, uneven_work,
                                               work_launch_note)
from instrumentation.analysis.traced_items import launches, tile_traced_heads
from app.figures.schedule_common import tile_source_text, traced_label
from instrumentation.analysis.schedule_model import DEFAULT_SMS, GPU_SMS

MODEL_SMS = sorted({4, 8, 16, 32, *GPU_SMS.values()})
MAX_COMPARED = 3
ANIMATE_BY_DEFAULT = 4096      # work items; beyond this the animation is drawn on demand
STRAGGLERS = 5

s = settings.current()
st.title("Tile schedule")
src = common.source_or_stop(s)
common.banner(src)
trace = src.trace
modelled = not trace.has_hw_timing
heads_h = int(trace.meta["shape"]["H"])


@st.cache_resource(show_spinner=False, max_entries=24)
def lanes_fig(key, sms, color_by, window, _trace):
    """window: (start, end) on the timeline's clock, or None for the whole run."""
    return sm_lanes_figure(_trace, cached_timeline(_trace, sms), color_by=color_by, highlight=STRAGGLERS,
                           t_range=window)


@st.cache_resource(show_spinner=False, max_entries=12)
def animation_fig(key, sms, color_by, bh, frame, controls, _trace):
    return tile_animation_figure(_trace, cached_timeline(_trace, sms), max_frames=DEFAULT_FRAMES, bh=bh,
                                 color_by=color_by, frame=frame, controls=controls)


@st.cache_resource(show_spinner=False, max_entries=24)
def straggler_tables(key, sms, _tl):
    """(latest-finishing SMs, longest work items) of this source's timeline: pandas work that
    would otherwise run again on every rerun. The items say whether they belong to a tile-traced
    head (tile_traced)."""
    return stragglers(_tl, STRAGGLERS, heads_h, traced=tile_traced_heads(trace))


@st.cache_resource(show_spinner=False, max_entries=24)
def traced_head_default(key, sms, _trace, _tl):
    return default_traced_head(_trace, _tl)


TABLES_CSS = ("<style>.st-key-sched_tables table th, .st-key-sched_tables table td "
              "{ padding: 0.3rem 0.4rem; }</style>")


def markdown_table(df, align: str | None = None) -> str:
    """A small DataFrame as a Markdown table, numbers to 4 significant digits and never in
    exponent form (289300, not 2.893e+05: a 128k recording's times in µs), right-aligned; text
    left-aligned (align: one alignment for every column)."""
    cells, colalign = {}, []
    for name, col in df.items():
        number = pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col)
        cells[name] = [_number(x) for x in col] if number else col.astype(str).tolist()
        colalign.append(align or ("right" if number else "left"))
    return pd.DataFrame(cells, columns=df.columns).to_markdown(index=False, disable_numparse=True,
                                                                 colalign=colalign)


def _number(x) -> str:
    if pd.isna(x):
        return ""
    if abs(x) >= 1e4 or float(x).is_integer():
        return f"{x:.0f}"
    return f"{x:.4g}"


@st.cache_resource(show_spinner=False, max_entries=12)
def imbalance_fig(key, sms, _trace):
    return imbalance_figure(_trace, cached_timeline(_trace, sms))


@st.cache_resource(show_spinner=False, max_entries=12)
def kv_sharing_fig(key, sms, _trace):
    return kv_sharing_figure(_trace, cached_timeline(_trace, sms))


# presentation: the page's controls fold into one collapsed expander and the metrics go under
# the lanes, so the lanes chart is one screen; normal mode keeps both on top
controls_box = st.expander("Controls", expanded=False, icon=":material/tune:",   # short: a pill beside
                           key="slide_controls") if s.present else st.container()   # the title (app/presentation.py)
# on slides the switches that draw more charts sit in the pill too: a switch that is off stood above the
# next slide (three of them pushed the compared schedules down to unreadable lane plots at 1280 px)
switches = controls_box if s.present else st
# a row of controls: SMs (modelled timelines only), colour, comparison, zoom
c1, c2, c3, c4 = controls_box.columns(4) if modelled else (None, *controls_box.columns(3))
sms = None
if modelled:
    url_state.control("sched_sms", DEFAULT_SMS, options=MODEL_SMS)
    sms = c1.selectbox("SMs in the modelled GPU", MODEL_SMS, key="sched_sms",
                       help="132 = H100/H200, 108 = A100; fewer SMs show more waves")
url_state.control("sched_color", "tiles_visited", options=list(COLOR_BY))
color_by = c2.selectbox("Colour work items by", list(COLOR_BY), key="sched_color", format_func=COLOR_BY.get)
url_state.control("sched_compare", False)
compare = c3.toggle("Compare schedules", key="sched_compare",     # short: a quarter of 1280 px holds it
                    help=f"up to {MAX_COMPARED} schedules of this problem side by side on one time axis")
if compare:     # drawn last: the toggle alone changed nothing in view
    c3.caption("↓ drawn under **Schedules side by side**, at the end of the page")
if modelled:
    (controls_box if s.present else st).warning("**Modelled timeline.** This trace comes from the Triton CPU interpreter, which has no "
               "clock and no SMs. The *order* in which work items started and the tiles each one "
               "visited are the kernel's own; their placement in time on SMs is a list-scheduling "
               f"model (instrumentation.analysis.schedule_model) on {sms} SMs, in tile-units.", icon=":material/schedule:")

tl = cached_timeline(trace, sms)
stats = cached_stats(trace, sms)
unit = "tile-units" if stats["modelled"] else "µs"


def metrics_markdown() -> str:
    """The schedule's metrics in µs (tile-units) and %: one Markdown table row. Six st.metric
    tiles (their chunk, tooltips and layout) took the browser ~0.16 s of the 16k page's opening on
    a 2-CPU machine (median of 10 interleaved visits); the table is drawn by the Markdown code the
    page loads anyway, and the explanations sit under it instead of in tooltips."""
    row = metrics_row(stats)
    if not spread_is_meaningful(stats):     # a tiny run: the spread metrics would only measure the GPU
        cells = {"makespan": f"{row['makespan']:.4g} {unit}",
                 "waves": f"{row['waves']:.2f} ({stats['work_items']} work items on {stats['sms']} SMs)",
                 "over ideal · tail · imbalance · idle": "not meaningful: fewer work items than SMs"}
        return markdown_table(pd.DataFrame([cells]), align="right") + "\n\n" + too_few_items_text(stats) + "."
    cells = {"makespan": f"{row['makespan']:.4g} {unit}",
             "tail": f"{row['tail']:.4g} {unit} ({row['tail_share']:.1f} % of makespan)",
             "over ideal": f"{row['over_ideal']:.1f} % (ideal {row['ideal']:.4g} {unit})",
             "load imbalance": f"{row['imbalance']:.3f}",
             "idle SM time": f"{row['idle']:.1f} %",
             "waves": f"{row['waves']:.2f} ({stats['work_items']} work items on {stats['sms']} SMs)"}
    return markdown_table(pd.DataFrame([cells]), align="right")


def metrics_caption() -> str:
    return " · ".join(f"**{label}**: {text}" for label, text in METRICS.values())


if not s.present:    # on slides the lanes chart's subtitle carries these numbers
    st.markdown(metrics_markdown())
    st.caption(metrics_caption())

# detail on zoom: the raster is redrawn for a time window at full resolution (the lanes are one
# image of ~900 time bins, so zooming in the browser alone would only enlarge the bins)
scale = 1.0 if modelled else 1e3
t_lo, t_hi = float(tl["t_start"].min()) / scale, float(tl["t_end"].max()) / scale
t_lo, t_hi = float(np.floor(t_lo)), float(np.ceil(t_hi))
if "sched_zoom" not in st.session_state and url_state.in_link("sched_window"):
    st.session_state["sched_zoom"] = True           # a link with a time window opens zoomed in
url_state.control("sched_zoom", False)
# the slider comes on request: its code (a slider, date and number formatting) is ~120 kB of
# JavaScript the browser would otherwise compile before the page settles
if c4.toggle("Zoom into time", key="sched_zoom",
             help="a slider that redraws the lanes over a shorter time at full detail"):
    url_state.control("sched_window", [t_lo, t_hi], parse=float)
    lo, hi = st.session_state["sched_window"]
    if not t_lo <= lo < hi <= t_hi:
        st.session_state["sched_window"] = [t_lo, t_hi]
    span = t_hi - t_lo
    step = float(10 ** np.floor(np.log10(span / 100))) if span > 0 else 1.0     # ~100-1000 steps: a
    window = controls_box.slider(f"Time window ({unit})", t_lo, t_hi, key="sched_window", step=step,  # finer
                                 format="%.0f" if step >= 1 else "%.2f",                  # slider is slow
                                 help="drag the ends to redraw the lanes over a shorter time at full detail")
else:
    window = (t_lo, t_hi)
    st.query_params.pop("sched_window", None)
full = tuple(window) == (t_lo, t_hi)
common.chart(lanes_fig(src.key, sms, color_by, None if full else (window[0] * scale, window[1] * scale), trace),
             "sm-lanes", "sched_lanes", s.present, cached=True)
st.caption(f"Each lane is one SM; every work item (one query block of one batch·head) is drawn at "
           f"its SM from start to end, coloured by {COLOR_BY[color_by]}. Hover a bar for its "
           f"numbers. Red outlines: the {STRAGGLERS} longest work items (numbered as below); "
           "triangles: the SMs that finish last"
           + (f"; magenta outlines: the items of the {traced_label(tile_traced_heads(trace))}" if tile_traced_heads(trace)
              else "") + ".  \n**Which launch:** " + work_launch_note(trace))
late, longest = straggler_tables(src.key, sms, tl)
# the two tables side by side fit 1280 px (the longest items' ten columns were 587 px in a 508 px
# column at Streamlit's cell padding): their cells padded less, here only
st.html(TABLES_CSS)
t1, t2 = st.container(key="sched_tables").columns([2, 3.4])
# static Markdown tables: an interactive grid costs the browser its own ~1.3 MB of JavaScript
# and a canvas per table, a tenth of a second of the page's first paint for five rows each
t1.markdown("**Latest-finishing SMs**\n\n" + markdown_table(
    late.assign(busy=late["busy"] / scale, last_end=late["last_end"] / scale,
                after_first_idle=late["after_first_idle"] / scale)
    .rename(columns={"sm": "SM", "items": "items", "busy": f"busy ({unit})",
                     "last_end": f"ends ({unit})", "after_first_idle": f"late by ({unit})"})))
if "tile_traced" in longest:      # yes / no reads better than True / False; the hyphen lets the header
    longest = longest.assign(tile_traced=longest["tile_traced"].map({True: "yes", False: "no"}))   # wrap
t2.markdown("**Longest work items** (# as outlined in the lanes)\n\n" + markdown_table(
    longest.assign(start=longest["start"] / scale, duration=longest["duration"] / scale)
    .drop(columns=["end"]).rename(columns={"q_block": "query block", "tiles_visited": "K/V tiles",
                                           "sm": "SM", "start": f"start ({unit})",
                                           "duration": f"duration ({unit})", "tile_traced": "tile-traced"})
    .set_axis(range(1, len(longest) + 1)).rename_axis("#").reset_index()))
st.caption(f"**busy**: time the SM ran work items · **ends**: its last work item ends · **late by**: how "
           f"long after the first SM went idle for good it finishes · **start**: after the first work "
           f"item started · **tile-traced**: an item of a head recorded tile by tile (outlined in magenta)"
           + (", drawn here from the launch without tile tracing, so its time is not the tracing's"
              if launches(trace)["separate"] and tile_traced_heads(trace) else
              ", from the same launch as the tiles, so tracing slowed it" if tile_traced_heads(trace) else "")
           + f". Times in {unit}.")

# the table is not drawn on slides (app/presentation.py), so neither is its switch
if not s.present and st.toggle("Show the order the kernel really ran the work items in (trace.work)", key="sched_order",
             help=f"{len(trace.work)} rows; drawn only when asked"):
    cols = [c for c in ("order", "bh", "q_block", "program", "tiles_visited", "sm", "t_start", "t_end")
            if c in trace.work.columns]
    if modelled:
        cols = [c for c in cols if c not in ("sm", "t_start", "t_end")]
    st.caption("`order`: the position in which each work item started. " + (
        "The interpreter has no clock, so the kernel counts starts with an atomic counter; the "
        "timeline above places the items on modelled SMs in exactly this order." if modelled else
        "SM ids and start/end times (ns, globaltimer) were recorded by the kernel on the GPU."))
    st.dataframe(trace.work.sort_values("order")[cols], hide_index=True, height=240)



st.subheader("The whole GPU over time")
heads = traced_heads(trace)
if not heads:
    st.info("This trace has no tile detail (recorded with level='work'): the animation needs level='full'.")
else:
    url_state.control("sched_anim", len(tl) <= ANIMATE_BY_DEFAULT)
    # not drawn: the toggle and one line on why (wide); drawn: the toggle and the player's controls
    h0, h1, h2, _ = st.columns([1, 1, 1, 1]) if st.session_state["sched_anim"] else (*st.columns([1, 3]), None, None)
    draw = (switches if s.present else h0).toggle("Draw the animation", key="sched_anim",
                     help=f"on by default up to {ANIMATE_BY_DEFAULT} work items; larger runs draw it "
                          "on demand so the page opens fast")
    default_bh, why = traced_head_default(src.key, sms, trace, tl)
    url_state.control("sched_head", default_bh, options=heads)     # a link's values are kept (and
    url_state.control("sched_still", False)                       # checked) while it is not drawn
    if not draw:    # its own controls come with it: fewer widgets for the browser to draw on opening
        h1.caption(f"{len(tl)} work items: switch on 'Draw the animation' to see every SM, every work "
                   f"item and the tiles of a traced head ({len(heads)} traced) over time.")
    else:
        bh = h1.selectbox("Traced head (tile grid)", heads, key="sched_head",
                          format_func=lambda b: f"bh {b} (batch {b // heads_h}, head {b % heads_h})",
                          help=f"the heads recorded with tile detail; default bh {default_bh}: {why}")
        still = h2.toggle("One frame at a time", key="sched_still",
                          help="a still of one frame with a slider, instead of the player")
        if still:
            @st.fragment
            def one_frame():
                """Only this part reruns when the frame changes."""
                opens = opening_frame(tl, bh, animation_times(tl, DEFAULT_FRAMES))   # as the player does
                url_state.control("sched_frame", opens, options=range(DEFAULT_FRAMES))
                k = st.slider("frame", 0, DEFAULT_FRAMES - 1, key="sched_frame",
                              help=f"{DEFAULT_FRAMES} frames evenly spread from the first start to the last end")
                common.chart(animation_fig(src.key, sms, color_by, bh, k, False, trace), "whole-gpu-frame",
                             "sched_frame_chart", s.present, cached=True)
            one_frame()
        else:
            common.chart(animation_fig(src.key, sms, color_by, bh, None, True, trace),    # opens mid-run or mid-head
                         "whole-gpu-animation", "sched_anim_chart", s.present, cached=True)
        st.caption("Top: the lanes with the time cursor, coloured as the colour bar says. Bottom left: every "
                   "work item, pending (pale blue), running (black) or done (blue). Bottom right: the traced head's "
                   f"tiles (default bh {default_bh}: {why}); black marks the tile each of its "
                   "running work items is on now, red the tiles the kernel visited although the mask says "
                   "skip (none expected). Pick a head that starts late to see it fill in at the end. "
                   f"Tile grid: {tile_source_text(trace)}.")
        video_menu(src, trace, sms, color_by, bh, s.present)

if uneven_work(tl):
    st.subheader("Causal imbalance")
    # a second chart costs the browser ~1 s on a loaded 2-CPU machine: large runs draw it when asked
    url_state.control("sched_imb", len(tl) <= ANIMATE_BY_DEFAULT)
    if switches.toggle("Draw the imbalance chart (duration vs K/V tiles per work item)", key="sched_imb",
                 help=f"on by default up to {ANIMATE_BY_DEFAULT} work items, so large runs open fast"):
        common.chart(imbalance_fig(src.key, sms, trace), "imbalance", "sched_imbalance", s.present, cached=True)
else:
    st.caption(f"No imbalance view: with mask {trace.meta.get('mask')} every work item visits about "
               "the same number of K/V tiles, so durations do not depend on the query block.")

st.subheader("Which query heads share a KV head (L2 reuse)")
url_state.control("sched_kv_on", len(tl) <= ANIMATE_BY_DEFAULT)
if switches.toggle("Draw the KV-head sharing chart (when each KV head's K/V is read, by how many)",
             key="sched_kv_on", help=f"on by default up to {ANIMATE_BY_DEFAULT} work items, so large runs open fast"):
    common.chart(kv_sharing_fig(src.key, sms, trace), "kv-sharing", "sched_kv", s.present, cached=True)


def compared_traces():
    """The traces to compare (this one first), or None after saying why not. On slides the
    picker sits in the Controls pill: the slide is the three lane plots, readable in a room."""
    where = controls_box if s.present else st
    if s.live:
        url_state.control("sched_cmp", [s.schedule], options=settings.SCHEDULES)
        picked = where.multiselect("Schedules", settings.SCHEDULES, key="sched_cmp", max_selections=MAX_COMPARED,
                                help="each runs live once (cached afterwards)")
        if len(picked) < 2:
            st.info("Pick two or three schedules.")
            return None
        if not where.button("Run and compare", key="sched_cmp_run", type="primary") and \
                not all(sources.has_run(settings.variant(s, x)) for x in picked):
            st.caption(f"Estimated: {sources.estimate(settings.variant(s, picked[0]))} per schedule.")
            return None
        try:
            return [sources.run_live(settings.variant(s, x))[0] for x in picked]
        except sources.RunError as exc:
            st.error(plain(exc))
            return None
    if src.recording is None:
        st.info("Comparing schedules needs a live run or bundled recordings (not an upload).")
        return None
    variants = sources.schedule_variants(sources.recordings(), src.recording)
    names = [r.name for r in variants]
    if len(names) < 2:
        st.info(f"No other bundled recording of this problem ({plain(src.recording.label)}) with another "
                "schedule. Pick a recording that has variants, or run live.")
        return None
    default = [src.recording.name] + [n for n in names if n != src.recording.name][:MAX_COMPARED - 1]
    url_state.control("sched_cmp", default, options=names)
    picked = where.multiselect("Recordings", names, key="sched_cmp", max_selections=MAX_COMPARED,
                            format_func=lambda n: f"{sources.recording_named(n).schedule} ({n})")
    if len(picked) < 2:
        st.info("Pick two or three recordings.")
        return None
    return [sources.load_recording(sources.recording_named(n)) for n in picked]


@st.cache_resource(show_spinner="Drawing the schedules…", max_entries=8)
def comparison(keys, sms, color_by, _traces):
    tls = [cached_timeline(t, sms) for t in _traces]
    return (schedule_comparison_figure(*_traces, sms=sms, color_by=color_by, tls=tls),
            schedule_comparison_stats(*_traces, sms=sms, tls=tls))


if compare:
    st.subheader("Schedules side by side")
    traces = compared_traces()
    if traces:
        from instrumentation.analysis.schedule_analysis import trace_digest
        try:
            fig, table = comparison(tuple(trace_digest(t) for t in traces), sms, color_by, traces)
        except ValueError as exc:
            st.error(f"These cannot be compared: {plain(exc)}")
        else:
            common.chart(fig, "schedule-comparison", "sched_cmp_chart", s.present, cached=True)
            u = table.attrs["unit"]
            cfg = {k: st.column_config.NumberColumn(
                f"{label} ({u})" if k in ("makespan", "ideal", "tail") else
                (f"{label} (%)" if k in ("over_ideal", "tail_share", "idle") else label),
                help=text, format="%.4g" if k in ("makespan", "ideal", "tail", "imbalance") else "%.2f")
                for k, (label, text) in METRICS.items()}
            tiny = [not spread_is_meaningful(cached_stats(t, sms)) for t in traces]
            if any(tiny):       # blank, not a misleading number, and the reason under the table
                table.loc[tiny, [c for c in SPREAD_METRICS if c in table.columns]] = np.nan
                st.caption(too_few_items_text(cached_stats(traces[tiny.index(True)], sms)) + ".")
            st.dataframe(table, hide_index=True, column_config=cfg)
            st.caption(metrics_caption())

st.subheader("Downloads")
common.trace_downloads(trace, "sched", tl=tl)
