"""Page 1: the tile schedule. SM lanes over time, the tile grid filling in, waves, idle SMs,
the causal tail, and two schedule variants side by side."""

import streamlit as st

from app import data_sources, settings, sources
from app.figures.schedule import (animation_times, imbalance_figure, schedule_comparison_figure,
                                  schedule_comparison_stats, sm_lanes_figure, tile_grid_figure)
from app.views import common
from instrumentation.schedule_model import DEFAULT_SMS, GPU_SMS, schedule_stats

MODEL_SMS = sorted({4, 8, 16, 32, *GPU_SMS.values()})
FRAME_BUDGET = 400_000     # heatmap cells over all animation frames: keeps the page light

s = settings.current()
st.title("Tile schedule")
src = common.source_or_stop(s)
common.banner(src)
trace = src.trace
modelled = not trace.has_hw_timing

c1, c2, c3 = st.columns([1, 1, 1])
sms = None
if modelled:
    sms = c1.selectbox("SMs in the modelled GPU", MODEL_SMS, index=MODEL_SMS.index(DEFAULT_SMS),
                       key="sched_sms", help="132 = H100/H200, 108 = A100; fewer SMs show more waves")
color_by = c2.selectbox("Colour work items by", ["tiles_visited", "q_block"], key="sched_color")
compare = c3.toggle("Compare two schedules", key="sched_compare")
if modelled:
    st.warning("**Modelled timeline.** This trace comes from the Triton CPU interpreter, which has no "
               "clock and no SMs. The *order* in which work items started and the tiles each one "
               "visited are the kernel's own; their placement in time on SMs is a list-scheduling "
               f"model (instrumentation.schedule_model) on {sms} SMs, in tile-units.", icon=":material/schedule:")

tl = common.timeline_for(src.key, sms, trace)
stats = schedule_stats(tl)
unit, scale = ("tile-units", 1.0) if stats["modelled"] else ("µs", 1e3)
m = st.columns(6)
m[0].metric("makespan", f"{stats['makespan'] / scale:.4g} {unit}")
m[1].metric("waves", f"{stats['waves']:.2f}", help=f"{stats['work_items']} work items on {stats['sms']} SMs")
m[2].metric("mean busy SMs", f"{stats['mean_concurrency']:.1f}")
m[3].metric("idle SM time", f"{stats['idle_fraction']:.0%}")
m[4].metric("tail", f"{stats['tail'] / scale:.4g} {unit}", help="from the first SM going idle for good to the end")
m[5].metric("imbalance", f"{stats['imbalance']:.2f}", help="max / mean busy time per SM (1 = even)")

common.chart(sm_lanes_figure(trace, tl, color_by=color_by), "sm-lanes", "sched_lanes", s.present)
with st.expander("The order the kernel really ran the work items in (trace.work)"):
    cols = [c for c in ("order", "bh", "q_block", "program", "tiles_visited", "sm", "t_start", "t_end")
            if c in trace.work.columns]
    if modelled:
        cols = [c for c in cols if c not in ("sm", "t_start", "t_end")]
    st.caption("`order`: the position in which each work item started. " + (
        "The interpreter has no clock, so the kernel counts starts with an atomic counter; the "
        "timeline above places the items on modelled SMs in exactly this order." if modelled else
        "SM ids and start/end times (ns, globaltimer) were recorded by the kernel on the GPU."))
    st.dataframe(trace.work.sort_values("order")[cols], hide_index=True, height=240)

st.subheader("The tile grid filling in")
if len(trace.tiles) == 0:
    st.info("This trace has no tile detail (recorded with level='work'): the grid needs level='full'.")
else:
    n_cells = int(trace.meta["n_q_blocks"]) * int(trace.meta["n_k_blocks"])
    frames = max(8, min(60, FRAME_BUDGET // max(n_cells, 1)))
    common.chart(common.animation_for(src.key, sms, frames, trace, tl), "tile-animation",
                 "sched_anim", s.present)
    a1, a2, _ = st.columns([2, 2, 6])
    for col, fmt in ((a1, "gif"), (a2, "mp4")):
        col.download_button(f"⬇ animation {fmt.upper()}", data=common._deferred(common.animation_bytes, trace, fmt, tl),
                            file_name=f"tile-schedule.{fmt}", mime=common.MIME[fmt],
                            key=f"sched_anim_{fmt}", on_click="ignore")

    @st.fragment
    def single_frame():
        """One frame at a time (for long runs): a slider and step buttons; only this part reruns."""
        times = animation_times(tl, 200)
        last = len(times) - 1
        st.session_state.setdefault("sched_frame", last)
        st.session_state["sched_frame"] = min(int(st.session_state["sched_frame"]), last)

        def step(delta):
            st.session_state["sched_frame"] = max(0, min(last, st.session_state["sched_frame"] + delta))

        b1, b2, b3 = st.columns([1, 1, 8])
        b1.button("◀ step", on_click=step, args=(-1,), key="sched_prev")
        b2.button("step ▶", on_click=step, args=(1,), key="sched_next")
        i = b3.slider("time (frame)", 0, last, key="sched_frame",
                      help="frame i of 200, evenly spaced from the first start to the last end")
        common.chart(tile_grid_figure(trace, t=float(times[i]), tl=tl), "tile-grid", "sched_grid",
                     s.present)

    if st.toggle("Single-frame view (a time slider and step buttons, for long runs)", key="sched_single"):
        single_frame()

st.subheader("Causal imbalance")
common.chart(imbalance_figure(trace, tl), "imbalance", "sched_imbalance", s.present)


def compare_schedules():
    if src.recording is None and not s.live:
        st.info("Comparing schedules needs a live run or bundled recordings (not an upload).")
        return
    if s.live:
        a, b = st.columns(2)
        others = [x for x in settings.SCHEDULES if x != s.schedule]
        first = a.selectbox("Schedule A", settings.SCHEDULES, index=settings.SCHEDULES.index(s.schedule),
                            key="cmp_a")
        second = b.selectbox("Schedule B", settings.SCHEDULES, index=settings.SCHEDULES.index(others[0]),
                             key="cmp_b")
        try:
            ta, _, _ = sources.run_live(settings.variant(s, first))
            tb, _, _ = sources.run_live(settings.variant(s, second))
        except sources.RunError as exc:
            st.error(str(exc))
            return
    else:
        variants = data_sources.schedule_variants(sources.recordings(), src.recording)
        if len(variants) < 2:
            st.info(f"No second bundled recording of this problem ({src.recording.label}) with "
                    "another schedule. Pick a recording that has variants, or run live.")
            return
        names = [r.name for r in variants]
        here = names.index(src.recording.name)
        a, b = st.columns(2)
        ra = a.selectbox("Recording A", names, index=here, key="cmp_rec_a",
                         format_func=lambda n: f"{n} ({sources.recording_named(n).schedule})")
        rb = b.selectbox("Recording B", names, index=0 if here else 1, key="cmp_rec_b",
                         format_func=lambda n: f"{n} ({sources.recording_named(n).schedule})")
        ta = sources.load_recording(sources.recording_named(ra))
        tb = sources.load_recording(sources.recording_named(rb))
    try:
        fig = schedule_comparison_figure(ta, tb, sms=sms)
        table = schedule_comparison_stats(ta, tb, sms=sms)
    except ValueError as exc:
        st.error(f"These two cannot be compared: {exc}")
        return
    common.chart(fig, "schedule-comparison", "sched_cmp", s.present)
    st.dataframe(table, hide_index=True)


if compare:
    st.subheader("Two schedules side by side")
    compare_schedules()

st.subheader("Downloads")
common.trace_downloads(trace, "sched", tl=tl)
