"""Page: low precision. A precision study (data/precision/NAME, made by
`python -m instrumentation.precision_study`): the error of bf16 and of three FP8 variants (per-tensor
scales, per-tile scales, per-tile scales after a Hadamard rotation) per (head, query block) against
one float64 reference, each variant's whole-output RMSE beside the FlashAttention-3 paper's, and
each variant's time and TFLOP/s."""

from pathlib import Path

import streamlit as st

from app import about, settings, sources, url_state
from app.figures.low_precision import (FA3_RMSE, FA3_SOURCE, FA3_TFLOPS, SHORT, VARIANTS, error_maps_figure,
                                       error_summary_figure, speed_figure, study, study_provenance)
from app.text import plain
from app.views import common

COMMAND = "python -m instrumentation.precision_study --preset fa3_outliers --out data/precision/NAME"


def recordings() -> dict[str, Path]:
    """{name: directory} of data/precision/*/ (GPU recordings first, then by name)."""
    found = sorted((sources.data_dir() / "precision").glob("*/manifest.json"))
    return {p.parent.name: p.parent for p in found}


def _default(recs: dict, metas: dict) -> str:
    """The recording a plain visit opens: a GPU run of FA3's outlier recipe, else a GPU run, else the first."""
    gpu = [n for n in recs if metas[n].get("backend") == "cuda"]
    outliers = [n for n in gpu if metas[n].get("precision_study", {}).get("preset") == "fa3_outliers"]
    return (outliers or gpu or list(recs))[0]


def _label(name: str, meta: dict) -> str:
    dev = meta.get("device_name", "?") if meta.get("backend") == "cuda" else "CPU interpreter"
    return f"{name} — {dev} · {meta.get('precision_study', {}).get('preset_label', '?')}"


s = settings.current()
st.title("Low precision: FP8 attention")
st.caption("FlashAttention-3 runs both matrix products of attention in 8-bit floating point (e4m3: 3 "
           "mantissa bits) on Hopper. Here the same inputs go through our bf16 kernel and three FP8 variants of "
           "our FP8 kernel (kernels.flash_attention_fp8): one scale per tensor, one scale per tile, and one per "
           "tile after a Hadamard rotation of Q and K. Each output is compared with one float64 reference.")
recs = recordings()
if not recs:
    st.warning(f"No precision studies are bundled (data/precision/ is empty). Make one with `{COMMAND}` "
               "(on a GPU; `--preset fa3_outliers_small --device cpu` runs in the interpreter).",
               icon=":material/folder_off:")
    st.stop()
try:
    metas = {n: common.trace_dir(p).meta for n, p in recs.items()}
except ValueError as exc:                # TraceFormatError: a broken recording, said in one line
    st.error(plain(f"A recording under data/precision/ cannot be read: {exc}"), icon=":material/error:")
    st.stop()
names = sorted(recs, key=lambda n: (metas[n].get("backend") != "cuda", n))
url_state.control("lp_rec", _default(recs, metas), options=names)
# presentation: the recording menu folds into the faint "Controls" pill, so the first slide is a chart
controls = (st.expander("Controls", expanded=False, icon=":material/tune:", key="slide_controls") if s.present
            else st.container())
name = controls.columns([3, 2])[0].selectbox("Precision study (data/precision/)", names, key="lp_rec",
                          format_func=lambda n: _label(n, metas[n]))
trace = common.trace_dir(recs[name])
common.name_downloads(name)
try:
    meta_study, table = study(trace)
except ValueError as exc:
    st.error(plain(str(exc)), icon=":material/error:")
    st.stop()
v = meta_study.get("variants", {})
timed = bool(meta_study.get("timed"))
if not s.present:
    st.info(f"**{plain(study_provenance(trace))}**  \n"
            + ("Times: " + plain(meta_study.get("timing") or "") if timed else
               "No timings: this study ran in the Triton CPU interpreter (real e4m3 arithmetic, no clock). "
               f"A GPU run: `{COMMAND}`."), icon=":material/info:")

if not s.present:
    st.caption("RMSE of the whole output against float64, per variant (hover ? for max |error| and times):")
m = common.metric_columns(len(v) or 1, s.present)
per_tensor = v.get("fp8_tensor", {}).get("rmse")
for col, (key, x) in zip(m, v.items()):
    ratio = (f"{x['rmse'] / per_tensor:.2f}× per-tensor" if per_tensor and key.startswith("fp8") and key != "fp8_tensor"
             else None)
    col.metric(SHORT.get(key, key).replace("<br>", " "), f"{x['rmse']:.2e}", ratio, delta_color="off", delta_arrow="off",
               help=f"RMSE of the whole output against float64; max |error| {x['max_abs']:.2e}"
                    + (f"; {x['total_ms']:.3f} ms, {x['tflops_total']:.0f} TFLOP/s" if "total_ms" in x else ""))

common.chart(error_maps_figure(trace, "rmse"), "precision-rmse", "lp_rmse", s.present)
st.caption("Each map is one variant: a row per head (b·H + h), a column per block of query rows, the colour "
           "that block's RMSE against float64 on one log scale for all four. A causal mask's first query "
           "blocks average few keys, so their outputs (and errors) are larger.")


def _where_words() -> str:
    """Where the error comes from, in words, with this recording's own numbers."""
    parts = []
    for key in ("fp8_tensor", "fp8_block", "fp8_block_hadamard"):
        x = v.get(key, {})
        if "rmse_qk_inputs" in x:
            parts.append(f"{VARIANTS[key]}: Q, K quantised alone {x['rmse_qk_inputs']:.2e}, V alone "
                         f"{x['rmse_v_input']:.2e}, the kernel {x['rmse']:.2e}")
    measured = ("  \n**In this recording** (RMSE, exact float64 attention on the quantised inputs beside the "
                "kernel): " + "; ".join(parts) + ".") if parts else ""
    return (
        "**Where the error comes from.** An FP8 kernel rounds three things to e4m3 (3 mantissa bits, so each "
        "value is off by up to 1/16 of itself): **Q and K** before **Q·Kᵀ**, and **P and V** before **P·V**. "
        "The scores are where it hurts: softmax exponentiates them, so a score off by δ scales its "
        "probability by e^δ, and a dot product's rounding error is set by its largest terms, q_i·k_i of the "
        "outlier features. One scale per tensor lets one outlier set the scale for everything; one scale per "
        "tile confines it to its tile; the Hadamard rotation (the same orthogonal matrix on Q and K, so Q·Kᵀ "
        "is unchanged) spreads each outlier over all D features before rounding, which shrinks the largest "
        "terms. **P·V** adds less: P lies in [0, 1] after the running max (one fixed scale), the softmax "
        "statistics m and l and the output accumulator stay in fp32, and V's rounding averages out over the "
        "keys." + measured)


st.markdown(_where_words())
common.chart(error_maps_figure(trace, "max_abs"), "precision-max-abs", "lp_max_abs", s.present)
common.chart(error_summary_figure(trace), "precision-summary", "lp_summary", s.present)
st.caption(f"Outlined bars: {FA3_SOURCE}, RMSE on their outlier inputs: FP16 {FA3_RMSE['FP16 (their baseline)']:.1e}, "
           f"FP8 per-tensor {FA3_RMSE['FP8 per-tensor']:.1e}, FP8 block + Hadamard {FA3_RMSE['FP8 block + Hadamard']:.1e}"
           " — the paper's numbers, not ours. Their baseline is FP16 (10 mantissa bits); ours is bf16 (7), "
           "about 8× coarser, so our baseline's RMSE is larger.")
common.chart(speed_figure(trace), "precision-speed", "lp_speed", s.present)
st.caption(f"The FP8 call is two passes: quantise (and rotate) Q, K, V, then attention on e4m3 inputs. Dashed: "
           f"{FA3_SOURCE}, FP8 forward {FA3_TFLOPS[128]} TFLOP/s at D 128 and {FA3_TFLOPS[256]} at D 256 — the "
           "paper's, on an H100, not measured here.")
if not s.present:
    with st.expander(f"The source's FP8 passage, and what FlashAttention-3 scales precisely"):
        st.markdown(f"{about.cite('cache_chapter')}:\n\n" + "\n\n".join(f"> {p}" for p in about.FP8_PASSAGE))
        st.markdown(about.FP8_PRECISELY)
    st.subheader("Downloads")
    common.trace_downloads(trace, "lp")
