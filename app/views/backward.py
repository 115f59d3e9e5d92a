"""Page: the backward pass. The dK/dV programs' column-wise tile order beside the forward's
row-wise order, SM lanes of the backward's phases, where a query block's dQ comes from, the time
split forward / D / dK·dV / dQ, and the backward's FLOPs and memory (instrumentation.estimate)."""

import dataclasses
import time

import streamlit as st

from app import settings, sidebar, sources, url_state
from app.figures._common import fmt_bytes
from app.figures.backward import has_backward, phase_blocks
from app.figures.backward_charts import (DEFAULT_SMS, dq_blocks, dq_chart, flops_chart, lanes_chart, memory_chart,
                                         order_chart, shape_of, time_chart, timeline_of, trace_estimate, traced_heads)
from app.figures.backward_time import flop_unit, pass_spans, time_split, untraced_ms
from app.text import plain
from app.views import common
from instrumentation import estimate
from instrumentation.analysis.traced_items import launch_note, traced_item_mask
from instrumentation.trace.backward_tables import one_pass as one_pass_backward

BUNDLED = "backward_n4096_causal"          # the bundled GPU recording with backward tables
RECORD_HINT = ("`python -m instrumentation.record_cli --backward ...` or "
               "`record(q, k, v, ..., backward=True)`")


@st.cache_resource(show_spinner=False, max_entries=8)
def live_backward(key: tuple, source: str):
    """(trace, seconds) of the settings' problem recorded with backward=True, on the inputs the
    live forward uses (make_inputs, seed 0)."""
    from app.sources.live import run_lock
    from instrumentation import make_inputs, record

    s = dict(key)
    with run_lock():
        started = time.perf_counter()
        q, k, v = make_inputs(s["batch"], s["heads"], s["seq_len"], s["head_dim"], s["dtype"], seed=0,
                              device="cuda" if source == "gpu" else "cpu", kv_heads=s.get("kv_heads") or None,
                              kv_len=s.get("kv_len") or None)
        _, trace = record(q, k, v, mask=s["mask"], block_m=s["block_m"], block_n=s["block_n"],
                          schedule=s["schedule"], backward=True,
                          meta_extra={"input_seed": 0, "inputs": "instrumentation.make_inputs"})
        return trace, time.perf_counter() - started


s = settings.current()
st.title("Backward pass")
st.caption("Training needs dQ, dK and dV. The backward never stores P: it recomputes each tile's "
           "P = exp(S − lse) from the forward's log-sum-exp. One program per key block walks its column "
           "and sums dK, dV; one program per query block walks its row again and sums dQ.")
src = common.source_or_stop(s)
trace = src.trace
def interpreter_refusal(s) -> str:
    """Why the interpreter would refuse this backward ('' if it would not), by arithmetic: the
    backward's tiles at its interpreter tile size against the interpreter's limit."""
    from kernels.backward import INTERPRETER_CONFIG
    from kernels.runtime import interpreter_tiles_refusal

    cfg = INTERPRETER_CONFIG
    tiles = max(estimate(s.batch, s.heads, s.h_kv, s.seq_len, s.n_k, s.head_dim, s.mask_text, s.dtype,
                         bm, bn).tiles_computed for bm, bn in ((cfg.block_m1, cfg.block_n1), (cfg.block_m2, cfg.block_n2)))
    return interpreter_tiles_refusal(tiles, f"the backward, per pass at its {cfg.block_m1}×{cfg.block_n1} interpreter tiles",
                                     f"lower N, B or H, or open {BUNDLED}")


if not has_backward(trace) and s.live:
    try:
        if s.source == "interpreter" and (why := interpreter_refusal(s)):
            raise ValueError(why)
        with st.spinner(f"Recording the backward {'on the GPU' if s.source == 'gpu' else 'in the interpreter'}…",
                        show_time=True):
            trace, took = live_backward(tuple(sorted(s.kernel().items())), s.source)
        src = dataclasses.replace(src, trace=trace, run_s=took, key=src.key + ":backward")
    except (ValueError, RuntimeError) as exc:
        st.error(plain(f"The backward could not be recorded: {exc}"), icon=":material/error:")
common.banner(src)

meta = trace.meta
one_pass = one_pass_backward(meta)
if one_pass:
    st.caption("This backward ran as **one pass** (FlashAttention-3's order, the Gluon kernel on Hopper): each "
               "key block's program also works out every visited tile's dQ part and adds it into a float32 dQ "
               "by one TMA reduce-add per tile and warpgroup, in whatever order the programs get there. So there "
               "are no dQ programs below: 7 tile products per visible tile become 5. Deterministic calls "
               "(`torch.use_deterministic_algorithms(True)`) run the two passes.")
sh = shape_of(trace)
est = trace_estimate(trace)
m = common.metric_columns(5, s.present)
m[0].metric("naive memory", fmt_bytes(est.naive_bwd_peak_bytes),
            help=f"naive backward: P, dP, dS, 3 × B·H·N_q·N_k·e + expansion = {est.naive_bwd_peak_bytes:,} B "
                 "(naive_bwd_peak_bytes)")
# the one pass adds dQ up in a float32 buffer (4·B·H·N_q·D bytes) beside the algorithm's O(N) state
dq_acc = 4 * sh["B"] * sh["H"] * sh["N_q"] * sh["D"] if one_pass else 0
m[1].metric("flash memory", fmt_bytes(est.flash_bwd_peak_bytes + dq_acc),
            help=f"flash backward: O, lse, D and lse₂ per row = {est.flash_bwd_peak_bytes:,} B (flash_bwd_peak_bytes)"
                 + (f" + the one pass's float32 dQ accumulator, 4·B·H·N_q·D = {dq_acc:,} B" if one_pass else ""))
flop_name, flop_div = flop_unit(est.flops_backward)      # the unit in the label: a value fits a fifth of 1280 px
m[2].metric(f"forward {flop_name}", f"{est.flops / flop_div:,.3g}",
            help=f"forward: 4·D·B·H·visible pairs = {est.flops:,} (flops)")
m[3].metric(f"backward {flop_name}", f"{est.flops_backward / flop_div:,.3g}",
            help=f"backward: 2.5 × the forward = {est.flops_backward:,} (flops_backward)")

if not has_backward(trace):
    if not s.live:                   # a live run that could not record the backward said why above
        st.info(f"This trace has only the forward: record one with the backward ({RECORD_HINT}) to see its "
                "tiles and lanes.", icon=":material/info:")
    if sources.recording_named(BUNDLED) is not None:
        st.button(f"Open the bundled backward recording: {BUNDLED}", on_click=sidebar.open_recording,
                  args=(BUNDLED,), key="bwd_open_bundled", type="primary")
    common.chart(flops_chart(trace), "backward-flops", "bwd_flops", s.present)
    common.chart(memory_chart(trace), "backward-memory", "bwd_memory", s.present)
    st.stop()

try:
    blocks = phase_blocks(meta)
except ValueError as exc:
    st.error(plain(str(exc)), icon=":material/error:")
    st.stop()
heads = traced_heads(trace)
qbs = []
if not heads:
    st.info("This trace keeps no tile detail of a head traced in both passes (level='work'): the tile "
            "order and dQ charts need one; the lanes and the time split are below.")
else:
    labels = [f"batch {b}, head {h}" for b, h in heads]
    url_state.control("bwd_head", labels[0], options=labels)
    # presentation: the two selectors fold into the faint "Controls" pill (app/presentation.py), as on
    # the schedule page, so the first slide is the tile-order chart
    controls = (st.expander("Controls", expanded=False, icon=":material/tune:", key="slide_controls") if s.present
                else st.container())
    c = controls.columns([2, 2, 3])
    b_sel, h_sel = heads[labels.index(c[0].selectbox("Head (traced)", labels, key="bwd_head"))]
    bh = b_sel * sh["H"] + h_sel
    qbs = dq_blocks(trace, b_sel, h_sel)
    if qbs:
        url_state.control("bwd_qblock", qbs[len(qbs) // 2], int, options=qbs)
        qb = c[1].selectbox(f"Query block for dQ ({blocks['dq'][0]} rows each)", qbs, key="bwd_qblock")
    dq_tiles = "" if one_pass else f", dQ {blocks['dq'][0]}×{blocks['dq'][1]}"
    c[2].caption(f"Tiles (queries × keys): forward {blocks['forward'][0]}×{blocks['forward'][1]}, "
                 f"{'dK·dV·dQ' if one_pass else 'dK·dV'} {blocks['dkdv'][0]}×{blocks['dkdv'][1]}{dq_tiles}; "
                 "the maps are in token positions, so they line up.")
    common.chart(order_chart(trace, bh), "backward-tile-order", "bwd_order", s.present)
    if qbs:                          # next to the order chart: both follow the selectors above them
        common.chart(dq_chart(trace, bh, q_block=qb), "backward-dq-sources", "bwd_dq", s.present)
    elif one_pass and not s.present:
        st.caption("**Where dQ comes from:** in the one pass a query block's dQ is what the key-block programs "
                   "add as each reaches one of its tiles, so the visited tiles along its row of the dK·dV·dQ map "
                   "are its sources. A recording made under `torch.use_deterministic_algorithms(True)` runs the "
                   "two passes and draws the dQ programs' own order.")

sms = int(meta.get("sm_count") or DEFAULT_SMS)
tl_bwd = timeline_of(trace, sms)
common.chart(lanes_chart(trace, sms), "backward-lanes", "bwd_lanes", s.present)
st.caption("**Which launch:** " + launch_note(trace, "bwd_work")
           + ((" Magenta outlines: the tile-traced heads' KV heads' programs." if one_pass else
               " Magenta outlines: the tile-traced heads' dQ programs and their KV heads' dK/dV programs.")
              if traced_item_mask(trace, "bwd_work").any() else ""))
fwd_tl = common.timeline_for(src.key, sms, trace)
if fwd_tl.attrs.get("modelled") or tl_bwd.attrs.get("modelled"):
    st.info("The time split forward / D / dK·dV / dQ is measured: it needs a GPU recording (open "
            f"{BUNDLED} or run on a GPU). The interpreter has no clock.", icon=":material/timer_off:")
else:
    fwd_span, bwd_span = pass_spans(time_split(fwd_tl, tl_bwd))
    traced = (f"the traced run's spans give {bwd_span / fwd_span:.2f}× (tracing slows the passes unevenly, and "
              "the backward's span holds any wait for its launches)")
    plain_ms = untraced_ms(meta)     # the headline is the kernels' own time, without tracing
    if plain_ms:
        m[4].metric("bwd ÷ fwd, untraced", f"{plain_ms[1] / plain_ms[0]:.2f}×",
                    help=f"untraced kernel times of the recorded call (do_bench medians): backward "
                         f"{plain_ms[1]:.4g} ms over forward {plain_ms[0]:.4g} ms; {traced}")
    else:
        m[4].metric("bwd ÷ fwd, traced", f"{bwd_span / fwd_span:.2f}×",
                    help="measured on the traced run (this recording has no untraced times): the backward's "
                         "span over the forward's, as in the time split chart")
    common.chart(time_chart(trace, fwd_tl, sms), "backward-time-split", "bwd_time", s.present)
common.chart(flops_chart(trace), "backward-flops", "bwd_flops", s.present)
common.chart(memory_chart(trace), "backward-memory", "bwd_memory", s.present)
if not s.present:
    st.subheader("Downloads")
    common.trace_downloads(trace, "bwd")
