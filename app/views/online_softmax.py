"""Page 3: the online softmax of one query row, stepped K tile by K tile from the kernel's own
running max m, sum l and rescale alpha, beside a float64 reference on the same inputs."""

import html
import json

import numpy as np
import streamlit as st

from app import presentation, settings, url_state
from app.text import RANGE_CONVENTION, key_range, plain
from app.figures.softmax import TILE_RULE, default_q_row, inputs_for_trace, softmax_steps
from app.figures.softmax_page import STEP_SLIDER, figures_at_step, softmax_page_figures, stepping_figures
from app.views import common

s = settings.current()
st.title("Online softmax")
src = common.source_or_stop(s)
common.banner(src)
trace = src.trace
if len(trace.rows) == 0:
    st.info("This trace has no per-row softmax state (recorded with level='work'). Record with "
            "level='full' (the default) to step through a row.")
    st.stop()


need = settings.regeneration_bytes(trace.meta)
if need > settings.MAX_REGENERATED_BYTES:    # by arithmetic, before a byte is allocated
    n_q, d = trace.seq_len, trace.meta["shape"]["D"]
    st.error(plain(f"This trace declares N={n_q:,}, D={d}: regenerating one head's q, k, v for the float64 "
                   f"reference would take {need / 2**30:,.1f} GiB, more than the "
                   f"{settings.MAX_REGENERATED_BYTES >> 20} MiB this page may spend. Record the problem at a "
                   "smaller N or D to step through a row here; the schedule, block-skip and memory pages "
                   "show this trace."), icon=":material/error:")
    st.stop()


@st.cache_resource(show_spinner="Regenerating the traced head's inputs…", max_entries=8)
def head_inputs(key: str, bh: int, _trace):
    """q, k, v of one head, regenerated with the recording's seed (make_inputs(heads_only=[bh]))."""
    return inputs_for_trace(_trace, bh)


heads = sorted(int(h) for h in trace.rows["bh"].unique())
# on slides the row's controls fold into the faint Controls pill (app/presentation.py): above the first
# chart they took ~130 px of a 1280 x 720 window and left it small
controls = st.expander("Controls", expanded=False, icon=":material/tune:", key="slide_controls") if s.present \
    else st.container()
c0, c1, c2 = controls.columns([1, 1, 2])
url_state.control("sm_head", heads[0], options=heads)
bh = int(c0.selectbox("Head (traced ones)", heads, key="sm_head", disabled=len(heads) == 1,
                      help="batch·head index bh = b·H + h of the heads whose rows the recording traced"))
bm, n = int(trace.meta["block_m"]), trace.seq_len
blocks = sorted(trace.rows.loc[trace.rows["bh"] == bh, "q_block"].unique().tolist())
# the default row teaches: its running max changes after the first tile, so α < 1 shows up
teaching_row = default_q_row(trace, bh)
url_state.control("sm_qblock", teaching_row // bm, options=blocks)
qb = c1.selectbox(f"Query block (of {bm} rows; traced ones)", blocks, key="sm_qblock",
                  help="blocks with per-row state in this trace: " + ", ".join(map(str, blocks)))
rows_in_block = min(bm, n - qb * bm)
url_state.control("sm_offset", teaching_row % bm if qb == teaching_row // bm else min(rows_in_block - 1, bm // 2),
                  options=range(rows_in_block))
offset = c2.slider("Row inside the block", 0, rows_in_block - 1, key="sm_offset")
q_row = qb * bm + offset

if trace.meta.get("inputs") not in (None, "instrumentation.make_inputs"):
    # the page draws each tile's scores and a float64 recurrence from the regenerated inputs: with
    # other inputs (a model's activations) every chart would show numbers the kernel never saw
    st.info(f"This trace's inputs ({plain(repr(trace.meta.get('inputs')))}) are not kept in it and cannot be "
            "regenerated, so its rows cannot be stepped against their scores here: open it in the tile "
            "schedule or block-skip map, or step a recording made with instrumentation.record.")
    st.stop()


@st.cache_resource(show_spinner=False, max_entries=16)
def row_steps(key: str, bh: int, q_row: int, _trace):
    """The row's steps (softmax_steps) and the page's figures at its first step, once per row:
    a step then only moves copies of them (app.figures.softmax_page.figures_at_step)."""
    q, k, v = head_inputs(key, bh, _trace)
    steps = softmax_steps(_trace, q_row, q, k, v, bh=bh)
    return steps, softmax_page_figures(steps)


@st.cache_resource(show_spinner=False, max_entries=16)
def row_charts(key: str, bh: int, q_row: int, opened_at: int, slide: bool, _steps, _figures) -> dict:
    """The page's four charts of a row with every step in them (stepping_figures), at the step
    the row opened on: the browser steps them from there, so they stay the same figures (and
    are not sent again) while the server follows the steps."""
    return stepping_figures(_figures, _steps, opened_at, slide=slide)


def percent(share: float) -> str:
    """A share in plain digits: '12.5 %', and '< 0.001 %' for round-off (never '1.86e-14 %')."""
    pct = 100 * share
    return "0 %" if pct == 0 else f"{pct:,.3g} %" if pct >= 1e-3 else "< 0.001 %"


steps, first_figures = row_steps(src.key, bh, q_row, trace)
if steps.attrs["inputs_verified"] is False:
    # record() kept the sums of the inputs the kernel saw: these regenerated ones are others (a
    # call from the Python API on the caller's own tensors), so no chart here could be true
    st.info(f"This trace was recorded from other inputs than make_inputs(seed {trace.meta.get('input_seed', 0)}) "
            f"(head {bh}'s q, k, v sums differ from the ones recorded), so its rows cannot be stepped against "
            "their scores here: open it in the tile schedule or block-skip map, or step a recording made with "
            "make_inputs (python -m instrumentation.record_cli).")
    st.stop()
if not steps.attrs["inputs_match"] and trace.meta.get("inputs") in (None, "instrumentation.make_inputs"):
    st.error("The kernel's m and l do not match the float64 reference on the regenerated inputs: "
             + ("they are the inputs it saw (their sums match the recording's), so the kernel is wrong."
                if steps.attrs["inputs_verified"] else
                f"either these are not the inputs it saw (seed {trace.meta.get('input_seed', 0)}, head {bh}) "
                "or the kernel is wrong.") + " Treat the comparison below with suspicion.", icon=":material/report:")
if steps.attrs["precision"] == "fp8":
    fp8 = trace.meta.get("fp8") if isinstance(trace.meta.get("fp8"), dict) else {}
    how = ("per-tile" if fp8.get("scaling") == "block" else "per-tensor") + " scales" + \
        (", Hadamard rotation" if fp8.get("hadamard") else "")
    st.caption(f"FP8 kernel: its m and ℓ are those of its e4m3 scores (Q and K quantised, {how}), the "
               f"reference is float64 on the inputs, so the two differ by the "
               f"quantisation: on this row by up to {steps.attrs['m_max_abs_err']:.3g} in m and "
               f"{percent(steps.attrs['l_max_rel_err'])} in ℓ. The Low precision page maps that error.")

# steps are numbered from 1 in the slider, the text and the link; default: the first rescale
n_steps = len(steps)
rescales = [j + 1 for j in range(1, n_steps) if steps["alpha_kernel"].iat[j] < 1]


def step(delta):
    st.session_state["sm_step"] = max(1, min(n_steps, st.session_state["sm_step"] + delta))


def diff(kernel: float, ref: float, relative: bool = False) -> str:
    """Kernel minus float64 reference, as text (a step where the row sees no key yet has m = −∞)."""
    if not (np.isfinite(kernel) and np.isfinite(ref)):
        return "same (−∞: no visible key yet)" if kernel == ref else f"reference {ref:.5g}"
    d = kernel - ref
    return f"{d / ref:+.1e} rel." if relative and ref else f"{d:+.1e} vs float64"


def slide_line(r, i: int, lo: int, hi: int) -> str:
    """The step in one line for a slide's step bar: the row, the keys it sees, the step's K block
    and the kernel's m, ℓ, α (the page's sentence and metric tiles, which slides hide)."""
    alpha = "0 (first tile)" if i == 0 else f"{r.alpha_kernel:.5f}"
    return (f"Query row {q_row} sees {key_range(lo, hi + 1)} · step {i + 1}/{n_steps}: K block {r.k_block} "
            f"({r.status}, {r.n_visible} visible) · m = {r.m_kernel:.5f} · ℓ = {r.l_kernel:.5f} · α = {alpha}")


# The browser steps the four charts: each carries a frame per step and a hidden Plotly slider over
# them (app.figures.softmax_page). This script moves every chart to the step the step slider
# shows (its thumb's aria-valuenow, which the browser updates at once while it is dragged and
# the server sets after a rerun), and to the step First / Prev / Next lead to the moment they are
# clicked, before the server has answered; the server then follows (the link, the text, the
# exports). A chart is moved by pressing its hidden slider at the step's tick, as a pointer would.
STEP_JS = """<style>
.st-key-sm_strip .slider-container, .st-key-sm_tile .slider-container, .st-key-sm_error .slider-container,
.st-key-sm_state .slider-container { opacity: 0 !important; pointer-events: none !important; }
</style><script>
(() => {
  const CHARTS = __CHARTS__, SLIDER = __SLIDER__;
  window.tsSoftmaxCharts = CHARTS;
  if (window.tsSoftmaxStep) { window.tsSoftmaxStep.sync(); return; }
  let pending = null, pendingAt = 0, queued = false;
  // the step shown: the step slider's thumb (live while it is dragged) or, before the slider has
  // drawn, the server's step written beside this script
  const thumb = () => document.querySelector('.st-key-sm_step [role="slider"]');
  const marker = () => document.querySelector('.ts-sm-step');
  const shown = () => { const t = thumb(), m = marker();
    return t ? Number(t.getAttribute('aria-valuenow')) : m ? Number(m.dataset.step) : null; };
  const wanted = () => {
    const v = shown();
    if (pending !== null && v !== pending && performance.now() - pendingAt < 5000) return pending;
    pending = null;
    return v;
  };
  const move = (gd, step) => {
    const sliders = (gd._fullLayout || {}).sliders || [];
    const k = sliders.findIndex(s => s.name === SLIDER);
    if (k < 0 || sliders[k].active === step - 1) return;
    // Plotly listens on the slider's rail and reads the pointer's x against the step's tick
    const group = gd.querySelectorAll('.slider-container .slider-group')[k];
    const tick = group && group.querySelectorAll('.slider-tick-rect')[step - 1];
    const rail = group && group.querySelector('.slider-rail-touch-rect');
    if (!tick || !rail) return;
    const r = tick.getBoundingClientRect();
    const at = {bubbles: true, cancelable: true, view: window, clientX: r.left + r.width / 2, clientY: r.top};
    rail.dispatchEvent(new MouseEvent('mousedown', at));
    gd.dispatchEvent(new MouseEvent('mouseup', at));
  };
  const sync = () => {
    queued = false;
    const step = wanted();
    if (step === null || !Number.isFinite(step)) return;
    for (const key of window.tsSoftmaxCharts) {
      const gd = document.querySelector('.st-key-' + key + ' .js-plotly-plot');
      if (gd) move(gd, step);
    }
  };
  const soon = () => { if (!queued) { queued = true; requestAnimationFrame(sync); } };
  window.tsSoftmaxStep = {sync};
  document.addEventListener('click', e => {
    const b = e.target.closest && e.target.closest('.st-key-sm_first button, .st-key-sm_prev button, .st-key-sm_next button');
    const m = marker();
    if (!b || b.disabled || !m) return;
    const at = wanted(), last = Number(m.dataset.last);
    const key = b.closest('[class*="st-key-sm_"]').className;
    const to = key.includes('st-key-sm_first') ? 1 : Math.max(1, Math.min(last, at + (key.includes('st-key-sm_next') ? 1 : -1)));
    pending = to; pendingAt = performance.now();
    sync();
  }, true);
  new MutationObserver(soon).observe(document.body, {subtree: true, childList: true, attributes: true,
                                                     attributeFilter: ['aria-valuenow']});
  soon();
})();
</script>"""


@st.fragment
def stepper():
    """The step controls and everything a step changes: a step reruns only this (the row's
    steps and figures are cached), not the page."""
    url_state.control("sm_step", rescales[0] if rescales else n_steps, options=range(1, n_steps + 1))
    # the stepping controls: on slides a bar fixed under the charts (app/presentation.py), so Next and
    # the chart it changes are on screen together
    bar = st.container(key=f"{presentation.STEP_BAR}_softmax")
    b1, b2, b3, b4 = bar.columns([1, 1, 1, 6])
    b1.button("First", icon=":material/first_page:", on_click=lambda: st.session_state.update(sm_step=1),
              key="sm_first")
    # at either end the button that would do nothing is greyed out, not silently ignored
    at_step = int(st.session_state["sm_step"])
    b2.button("Prev", icon=":material/chevron_left:", on_click=step, args=(-1,), key="sm_prev",
              disabled=at_step <= 1, help="the first step" if at_step <= 1 else None)
    b3.button("Next", icon=":material/chevron_right:", on_click=step, args=(1,), key="sm_next",
              disabled=at_step >= n_steps, help="the last step: the row has seen every tile" if at_step >= n_steps else None)
    if n_steps > 1:
        b4.slider("Step (K tile in the kernel's order)", 1, n_steps, key="sm_step",   # slides: the bar's line
                  label_visibility="collapsed" if s.present else "visible")              # says the step
    i = int(st.session_state["sm_step"]) - 1
    r = steps.iloc[i]
    lo, hi = steps.attrs["visible"]
    if s.present:       # slides hide the words and metrics below: the bar says the step's numbers
        bar.html(f'<div style="font-size:1.05rem;color:#111;line-height:1.4">{html.escape(slide_line(r, i, lo, hi))}</div>')
    if rescales:
        st.caption(f"α < 1 (the running max grew and the old m, l, O′ were rescaled) at step"
                   f"{'s' if len(rescales) > 1 else ''} {', '.join(map(str, rescales))}.")
    else:
        st.caption("This row's running max never changes after its first tile (α = 1 from step 2 on); "
                   f"query row {teaching_row} rescales.")

    dead = int((steps["n_visible"] == 0).sum())
    st.markdown(f"**Query row {q_row}** (head bh={bh}, mask `{steps.attrs['mask']}`) sees {key_range(lo, hi + 1)}; "
                f"the kernel visits **{len(steps)} K tiles** of {steps.attrs['n_k_blocks']}"
                + (f", **{dead}** of them with no key this row sees" if dead else "") + ". "
                f"Step **{i + 1}/{len(steps)}**: K block {r.k_block} ({r.status}, {key_range(r.key_start, r.key_end)}, "
                f"{r.n_visible} visible to this row).")
    st.caption(TILE_RULE + " " + RANGE_CONVENTION)

    m = st.columns(5)
    m[0].metric("running m (kernel)", f"{r.m_kernel:.5f}", diff(r.m_kernel, r.m_ref),
                delta_color="off", delta_arrow="off")
    m[1].metric("running ℓ (kernel)", f"{r.l_kernel:.5f}", diff(r.l_kernel, r.l_ref, relative=True),
                delta_color="off", delta_arrow="off")
    m[2].metric("α this step (kernel)", f"{r.alpha_kernel:.5f}", "0 on the first tile" if i == 0 else
                diff(r.alpha_kernel, r.alpha_ref), delta_color="off", delta_arrow="off")
    m[3].metric("output error so far", "n/a" if not np.isfinite(r.out_rel_err) else percent(r.out_rel_err),
                help="‖O'/ℓ − O‖/‖O‖: the row's output if the softmax stopped after this step (keys so "
                     "far only) against the exact float64 output over every key; near 0 % after the last step")
    kerr = steps.attrs.get("kernel_out_rel_err")
    m[4].metric(f"kernel O error ({steps.attrs.get('dtype')})",
                "n/a" if kerr is None or not np.isfinite(kerr) else f"{kerr:.2e}",
                help="the kernel's final O for this row vs the float64 reference")

    # the charts: built at the step this row opened on and stepped in the browser (STEP_JS); the
    # exports draw the figure at the server's step
    row = (src.key, bh, q_row, s.present)
    if st.session_state.get("_sm_opened", (None,))[0] != row:
        st.session_state["_sm_opened"] = (row, i)
    opened_at = st.session_state["_sm_opened"][1]
    charts = row_charts(src.key, bh, q_row, opened_at, s.present, steps, first_figures)
    for name, fig in charts.items():
        common.chart(fig, name, name.replace("softmax-", "sm_"), s.present, cached=True,
                     exported=lambda name=name, i=i: figures_at_step({name: first_figures[name]}, steps, i)[name])
    st.html(f'<span class="ts-sm-step" data-step="{i + 1}" data-last="{n_steps}" hidden></span>'
            + STEP_JS.replace("__CHARTS__", json.dumps(["sm_tile", "sm_strip", "sm_error", "sm_state"]))
            .replace("__SLIDER__", json.dumps(STEP_SLIDER)), unsafe_allow_javascript=True)


stepper()

with st.expander("Every step as a table"):
    st.dataframe(steps.drop(columns=["scores"]).assign(step=steps["step"] + 1), hide_index=True)
with st.expander("The algorithm (as the vLLM lesson “FlashAttention” writes it)"):
    st.code("""m, l, O' = -inf, 0, zeros(d)          # running stats, live in SRAM
for t in tiles:   # the K blocks that SOME row of this row's Q block sees: the kernel
                  # skips per (Q block, K block) tile, not per row, so a row can get a
                  # block it sees no key of (all -inf there: alpha = 1, P = 0)
    S     = q @ K_t.T / sqrt(d)         # 1 x TILE, in SRAM only; keys the row's mask hides: -inf
    m_new = max(m, max(S))
    alpha = exp(m - m_new)              # rescale factor for the old stats
    P     = exp(S - m_new)
    l     = alpha * l + sum(P)
    O'    = alpha * O' + P @ V_t
    m     = m_new
return O' / l""", language="python")

st.subheader("Downloads")
common.trace_downloads(trace, "sm")
