"""Page: prefill vs decode. One decode step of split-KV attention (kernels.flash_decode) with one
split and with the chosen split: SM lanes, one row's partial states merged split by split, the
roofline of prefill vs decode, and KV-cache bytes per token for MHA vs GQA."""

from pathlib import Path

import streamlit as st

from app import presentation, settings, sources, url_state
from app.text import RANGE_CONVENTION, plain
from app.figures.decode import (LANES_TRACED, REPLAY_MEDIAN, decode_kv_figure, decode_pair_lanes_figure,
                                decode_pair_roofline_figure, decode_row_steps, merge_figure)
from app.views import common
from instrumentation.analysis import decode_model as dm

s = settings.current()
st.title("Prefill vs decode")
st.caption("At decode time Q has one row per sequence: FlashAttention-2's one program per (head, "
           "query block) starts a handful of programs, and the step is bound by reading the KV "
           "cache. Split-KV (FlashDecoding) gives each program a slice of the keys and merges the "
           "partial softmax states with the online-softmax algebra.")
# the interpreter runs one numpy op at a time: B=1 at 1k takes about 8 s for both runs on 2 CPUs
LIVE_LIMITS = {"interpreter": dict(batch=2, context=2048), "gpu": dict(batch=64, context=131072)}


@st.cache_resource(show_spinner="Running the decode kernel…", max_entries=8)
def live_pair(where, preset, batch, context, ragged, n_q, splits):
    import torch

    from app.sources.live import run_lock
    from instrumentation import make_decode_inputs, record_decode

    p = dm.PRESETS[preset]
    dev = "cuda" if where == "gpu" else "cpu"
    q, k, v = make_decode_inputs(batch, p["heads"], p["kv_heads"], context, p["head_dim"], n_q,
                                 "bf16" if dev == "cuda" else "fp32", seed=0, device=dev)
    lens = None
    if ragged:  # lengths spread evenly from context/batch up to context
        lens = torch.linspace(max(1, context // batch), context, batch).round().to(torch.int32).to(dev)
    with run_lock():             # the process's one run lock: no other session's kernels meanwhile
        return tuple(record_decode(q, k, v, lens, num_splits=n, measure=dev == "cuda")[1] for n in (1, splits))


@st.cache_resource(show_spinner=False, max_entries=8)
def recorded_pair(b1_dir: str, b2_dir: str, mtime: float):
    from instrumentation.trace import Trace

    return Trace.load(b1_dir), Trace.load(b2_dir)


def bundled() -> dict:
    """{batch: {splits label: path}} of data/decode/*/ recordings."""
    out = {}
    for man in sorted((sources.data_dir() / "decode").glob("*/manifest.json")):
        name = man.parent.name                                 # decode_b8_ctx32k_splits-auto
        parts = dict(p.split("-", 1) if "-" in p else (p, "") for p in name.split("_"))
        try:
            out.setdefault(int(name.split("_b")[1].split("_")[0]), {})[parts.get("splits", "?")] = man.parent
        except (IndexError, ValueError):
            continue
    return out


# -- controls (page-level, kept in the URL) --------------------------------------------------------
live = s.source in ("gpu", "interpreter")
c = st.columns([2, 1, 1, 1, 1, 1])      # the preset's label is the long one
url_state.control("dec_preset", "llama-3-8b", options=list(dm.PRESETS))
preset = c[0].selectbox("model preset", list(dm.PRESETS), key="dec_preset",
                        format_func=lambda name: dm.PRESETS[name]["label"])
p = dm.PRESETS[preset]
if live:
    lim = LIVE_LIMITS[s.source]
    url_state.control("dec_batch", 1, int, bounds=(1, lim["batch"]))
    batch = c[1].number_input("batch B", 1, lim["batch"], key="dec_batch")
    url_state.control("dec_ctx", 1024 if s.source == "interpreter" else 32768, int, bounds=(16, lim["context"]))
    context = c[2].number_input("context length", 16, lim["context"], step=256, key="dec_ctx")
    url_state.control("dec_ragged", False)            # 1 or 0; anything else is named in a warning
    ragged = c[3].checkbox("ragged", key="dec_ragged",       # "ragged lengths" was cut to "ragged …" at 1280 px
                           help="ragged lengths: spread evenly from context/B up to context")
    url_state.control("dec_nq", 1, int, bounds=(1, 16))
    n_q = c[4].number_input("N_q", 1, 16, key="dec_nq", help="queries per sequence (speculative decoding)")
    url_state.control("dec_splits", "auto", options=["auto"] + [str(i) for i in range(2, 129)])
    split_text = c[5].selectbox("splits", ["auto"] + [str(i) for i in (2, 3, 4, 8, 16, 32, 64, 128)],
                                key="dec_splits")
    splits = "auto" if split_text == "auto" else int(split_text)
    modelled_rule = None
    if s.source == "interpreter" and splits == "auto":
        # the interpreter has no SMs: take the rule's choice for the modelled H100 instead
        splits, modelled_rule = dm.auto_splits(int(batch), p["heads"], p["kv_heads"], int(n_q),
                                               p["head_dim"], int(context), dm.DATASHEET["H100"]["sms"])
    if s.source == "interpreter":
        st.info("Live in the CPU interpreter: real split ranges and softmax states, **modelled "
                "timing** (no hardware clocks). Sizes are capped; the bundled GPU recordings show "
                "32k contexts.", icon=":material/memory:")
    try:
        one, chosen = live_pair(s.source, preset, int(batch), int(context), bool(ragged), int(n_q), splits)
        common.name_downloads(f"decode_b{int(batch)}_ctx{int(context)}_{s.source}")
    except ValueError as exc:
        st.error(plain(exc), icon=":material/error:")
        st.stop()
else:
    modelled_rule = None
    recs = bundled()
    if not recs:
        st.warning("No decode recordings are bundled (data/decode/ is empty). Switch the source to "
                   "the live interpreter, or record some on a GPU with `python -m "
                   "instrumentation.decode_cli --out data/decode/NAME`.", icon=":material/folder_off:")
        st.stop()
    url_state.control("dec_rec_batch", min(recs), int, options=sorted(recs))
    batch = c[1].selectbox("batch B (recorded)", sorted(recs), key="dec_rec_batch")
    pair = recs[batch]
    if "1" not in pair or len(pair) < 2:
        st.error(f"The recordings for B={batch} lack splits=1 or the chosen split: {sorted(pair)}")
        st.stop()
    other = next(k for k in sorted(pair) if k != "1")
    one, chosen = recorded_pair(str(pair["1"]), str(pair[other]),
                                Path(pair[other], "manifest.json").stat().st_mtime)
    common.name_downloads(Path(pair[other]).name)
    shape = chosen.meta["shape"]
    c[2].metric("context", f"{shape['N_k']:,}")
    c[3].metric("H / H_kv", f"{shape['H']} / {shape['H_kv']}")
    c[4].metric("N_q, D", f"{shape['N_q']}, {shape['D']}")
    c[5].metric("splits", f"1 vs {chosen.meta['kernel']['num_splits']}")
    st.caption(f"The recordings use Llama-3-8B attention shapes (H 32, H_kv 8, D 128); the preset "
               f"above drives the KV-cache chart. Data: {plain(chosen.provenance())}.")

meta = chosen.meta
bw = meta.get("bandwidth", {})


# -- 1. SM lanes -------------------------------------------------------------------------------------
st.subheader("SM lanes: one split vs the chosen split")
m = st.columns(4)
for col, tr, name in ((m[0], one, "1 split"), (m[1], chosen, f"{meta['kernel']['num_splits']} splits")):
    t = tr.meta
    if t.get("untraced_ms"):
        col.metric(f"{name} · replay median", f"{t['untraced_ms'] * 1e3:.1f} µs",
                   f"{t['bandwidth']['op_gbps']:.0f} GB/s = {(t['bandwidth']['op_fraction_of_copy'] or 0):.0%} of copy",
                   delta_color="off", delta_arrow="off",
                   help=f"{REPLAY_MEDIAN} (L2 flushed before each replay, launch included); the lanes below "
                        f"are {LANES_TRACED} after an L2 read flush, timed from the first program's start")
    else:
        col.metric(name, f"{t['kernel']['programs']} programs", "no hardware timing", delta_color="off", delta_arrow="off")
rule = modelled_rule or meta["split_rule"]
m[2].metric("split rule (auto)" + (", modelled H100" if modelled_rule else ""), f"{rule['num_splits']} splits",
            f"{rule['work_items']} items · {rule['sm_count']} SMs · {rule['key_blocks']} blocks",
            delta_color="off", delta_arrow="off")
m[3].metric("measured copy bandwidth", f"{bw['copy_gbps']:.0f} GB/s" if bw.get("copy_gbps") else "—",
            "device-to-device copy" if bw.get("copy_gbps") else "interpreter: not measured", delta_color="off", delta_arrow="off")
common.chart(decode_pair_lanes_figure(one, chosen), "decode-lanes", "dec_lanes", s.present)

common.trace_downloads(chosen, key="dec_trace")

# -- 2. the merge of one row ---------------------------------------------------------------------------
st.subheader("Merging one row's partial states")
parts = chosen.partials
# on slides the row and step controls are a bar under the charts (app/presentation.py STEP_BAR),
# so the merge chart and the controls that step it are on screen together
r = st.container(key=f"{presentation.STEP_BAR}_decode").columns(4)
b_sel = r[0].number_input("sequence b", 0, int(parts.b.max()), 0, key="dec_b")
h_sel = r[1].number_input("query head", 0, int(parts["head"].max()), 0, key="dec_h")
t_sel = r[2].number_input("query row t", 0, int(parts.q_row.max()), int(parts.q_row.max()), key="dec_t")
steps, row_label = decode_row_steps(chosen, int(b_sel), int(h_sel), int(t_sel))
if len(steps) > 1:
    step = r[3].slider("merge step", 1, len(steps), len(steps), key="dec_step") - 1
else:
    step = 0
    r[3].caption("one split: nothing to merge (stage 1 wrote O directly)")
common.chart(merge_figure(steps, step, chosen.provenance(), row_label),
             "decode-merge", "dec_merge", s.present)
st.caption("m = max_j m_j,  O = Σ e^(m_j − m)·l_j·O_j / Σ e^(m_j − m)·l_j  (the merge, run by the last "
           "split program of each KV head to finish; m_j, l_j are what the splits wrote, in natural units). "
           "The last step's m + log l is the kernel's log-sum-exp. " + RANGE_CONVENTION)

# -- 3. roofline --------------------------------------------------------------------------------------
st.subheader("Roofline: prefill vs decode")
common.chart(decode_pair_roofline_figure(one, chosen), "decode-roofline", "dec_roof", s.present)

# -- 4. KV-cache bytes per token -----------------------------------------------------------------------
st.subheader("KV-cache bytes per token")
common.chart(decode_kv_figure(preset, int(batch), int(meta["shape"]["N_k"]),
                              None if live else f"recording ({chosen.provenance()})"),
             "decode-kv-bytes", "dec_kv", s.present)
