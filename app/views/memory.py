"""Page 4: memory and traffic. Naive vs flash over N from the bundled sweep (measured peak
memory with the GPU's capacity and OOM points, time, HBM traffic models and ncu measurements),
the HBM calculator of the vLLM lesson "FlashAttention" and the scaling table of "FlashAttention
— The Tiling Strategy" beside the exact counts. Sources are named by title, never by file id."""

from pathlib import Path

import streamlit as st

from app import settings, sources
from app.about import cite
from app.text import plain
from app.views import common
from app.figures.memory import (hbm_calculator_figure, hbm_calculator_numbers, memory_figure,
                                model_curves_figure, time_figure, tile_count_point, traffic_figure)
from app.figures._common import fmt_bytes
from instrumentation.analysis import hbm
from instrumentation.analysis.traffic import trace_traffic
from instrumentation.trace.sweep_file import load_sweep

LESSON = cite("vllm_lesson")
TILING = cite("tiling_strategy")

s = settings.current()
st.title("Memory and traffic")


@st.cache_data(show_spinner=False, max_entries=16)
def sweep(path: str, mtime: float):
    return load_sweep(path)


def ncu_vs_models(rows) -> str:
    """Why measured DRAM bytes and the sources' models differ, with this sweep's own ratios."""
    measured = rows["dram_read_bytes"] + rows["dram_write_bytes"]
    parts = []
    for impl, model_col in (("naive", "model_naive_bytes"), ("flash", "model_flash_bytes")):
        sel = rows["impl"] == impl
        if sel.any():
            ratio = (measured[sel] / rows.loc[sel, model_col])
            parts.append(f"{impl}: measured / model = {ratio.min():.2f}–{ratio.max():.2f}")
    flash = rows["impl"] == "flash"
    tiled = (measured[flash] / rows.loc[flash, "model_flash_tiled_bytes"]) if flash.any() else None
    text = ("ncu (DRAM bytes read + written, one forward) against the models — " + "; ".join(parts) + ". "
            "Naive moves more than the lesson's model because kernels.naive_attention scales S in a "
            "separate pass (one more N×N write and read: 12·T² bytes per head instead of 8·T²). "
            "Flash reads Q, K, V from DRAM about once: its K/V re-reads hit the L2")
    if tiled is not None and len(tiled):
        text += f" (only {tiled.max():.1%} of the tiled model's bytes reach DRAM)"
    return text + ", and part of O is still in the write-back L2 when the kernel ends."


# -- measured sweep ------------------------------------------------------------------------------
st.subheader("Naive vs flash over N")
paths = sources.discover_sweeps()
if not paths:
    st.warning("No measured sweep is bundled here (data/sweeps/*.json is missing), so there are "
               "no measurements on this page. Everything below is an **analytic model** "
               "(instrumentation.analysis.hbm), labelled as such.", icon=":material/straighten:")
else:
    path = st.selectbox("Sweep", paths, format_func=lambda p: Path(p).name, key="mem_sweep")
    try:
        meta, df = sweep(str(path), Path(path).stat().st_mtime)
    except (ValueError, OSError) as exc:
        st.error(f"The sweep {plain(Path(path).name)} cannot be read: {plain(exc)}")
        st.stop()
    st.info(f"**Data: sweep {plain(Path(path).name)}** · " + plain(
            f"{meta.get('device_name')} · backend {meta.get('backend')} · recorded {common.when(meta.get('created'))} · torch "
            f"{meta.get('torch_version')}, triton {meta.get('triton_version')}"
            + (f", CUDA {meta['cuda_version']}" if meta.get("cuda_version") else "")
            + (f", driver {meta['driver_version']}" if meta.get("driver_version") else "")), icon=":material/info:")
    if meta.get("backend") != "cuda":
        st.warning("This sweep was not measured on a GPU: " + plain(str(meta.get("peak_memory", ""))
                   + "; " + str(meta.get("timing", ""))), icon=":material/warning:")
    n_oom = int(df["oom"].sum())
    c = st.columns(4)
    c[0].metric("points", len(df))
    c[1].metric("largest N", f"{int(df['seq_len'].max()):,}")
    c[2].metric("OOM points", n_oom)
    c[3].metric("ncu measurements", int(df["dram_read_bytes"].notna().sum()))
    if df["peak_bytes"].notna().any() or n_oom:
        common.chart(memory_figure(df, meta), "peak-memory", "mem_peak", s.present)
    else:
        st.info(f"Peak memory: {plain(meta.get('peak_memory', 'not measured in this sweep'))}.")
    common.chart(time_figure(df, meta), "time", "mem_time", s.present)
    common.chart(traffic_figure(df, meta), "hbm-traffic", "mem_traffic", s.present)
    ncu_rows = df[df["dram_read_bytes"].notna()]
    if len(ncu_rows):
        st.caption(ncu_vs_models(ncu_rows))
    with st.expander("Sweep records"):
        st.dataframe(df, hide_index=True)
    st.download_button("⬇ sweep records (CSV)", data=common._deferred(lambda: df.to_csv(index=False)),
                       file_name=f"{Path(path).stem}.csv", mime="text/csv", key="mem_sweep_csv",
                       on_click="ignore")

# -- the lesson's HBM calculator ------------------------------------------------------------------
st.subheader("HBM-traffic calculator (model)")
st.caption(f"The calculator of {LESSON}: bytes that cross HBM for one attention layer, batch 1.")
c1, c2, c3 = st.columns(3)
T = c1.select_slider("sequence length T", [2 ** k for k in range(7, 18)], value=8192, key="mem_T")
h = c2.slider("heads h", 1, 128, 32, key="mem_h")
d = c3.select_slider("head dim d", [16, 32, 64, 128, 256], value=128, key="mem_d")
c1, c2, c3 = st.columns(3)
dtype = c1.selectbox("dtype", ["fp16", "bf16", "fp32"], key="mem_dtype")
bq = c2.select_slider("tile block_q", settings.BLOCK_SIZES, value=128, key="mem_bq")
bkv = c3.select_slider("tile block_kv", settings.BLOCK_SIZES, value=128, key="mem_bkv",
                       help="as the lesson says: tile sizes do not move the bars; they change SRAM pressure "
                            "and the inner-loop count")
el = hbm.DTYPE_BYTES[dtype]
calc = hbm_calculator_numbers(T, h, d, bq, bkv, el)
naive, flash = calc["naive_bytes"], calc["flash_bytes"]
m = st.columns(4)
m[0].metric("naive HBM", fmt_bytes(naive), help=f"{naive:,} bytes (decimal units: 1 GB = 10⁹ B)")
m[1].metric("flash HBM", fmt_bytes(flash), help=f"{flash:,} bytes (decimal units: 1 MB = 10⁶ B)")
m[2].metric("reduction", f"{calc['reduction']:.1f}×")
m[3].metric("dominant term (naive)", "S and P (T²)" if calc["naive_sp_bytes"] > calc["naive_qkvo_bytes"]
            else "Q, K, V, O (T·d)", help=calc["dominant_term"], delta=
            f"{calc['naive_sp_bytes'] / naive:.0%} of naive", delta_color="off", delta_arrow="off")
common.chart(hbm_calculator_figure(T, h, d, bq, bkv, el), "hbm-calculator", "mem_calc", s.present)
ex = hbm.seed000_example()
st.caption(f"S and P bytes overtake Q, K, V, O at T = {calc['crossover_T']:,.0f} (T = d: $4hT^2 = 4hTd$). "
           f"Tiled flash (K and V re-read once per query block of {bq}): "
           f"{fmt_bytes(calc['flash_tiled_bytes'])} ({calc['reduction_tiled']:.1f}× less than naive). "
           f"Changing block_kv (now {bkv}) moves no byte. The lesson's example (T = 8,192, h = 32, d = 128, fp16): "
           f"{fmt_bytes(ex['naive_bytes'])} naive vs {fmt_bytes(ex['flash_bytes'])} flash, "
           f"{ex['reduction']:.0f}× less (the lesson states ~17.8 GB, 270 MB, ~65×). The lesson's “17.6 GB” "
           f"for the S, P term $4hT^2 \\times 2$ B is a rounding slip: it is "
           f"{fmt_bytes(ex['naive_t2_term_bytes'])} ($2^{{34}}$ B), and the exact naive total, "
           f"{fmt_bytes(ex['naive_bytes'])}, is within 2% of the stated 17.8 GB. Decimal units: 1 GB = 10⁹ B.")
if not paths:
    common.chart(model_curves_figure(h, d, el, bq), "hbm-model-curves", "mem_model", s.present)

# -- the tiling article's scaling table ------------------------------------------------------------
st.subheader("The tiling article's scaling table, beside the exact counts")
st.caption(f"From {TILING}: HBM traffic of standard and flash attention as N grows, as the article "
           "states it and as its own per-tile formula counts it.")
table = hbm.seed003_scaling_table()
# two narrow tables instead of one nine-column table that the page clips on the right
STATED = {"N": "N (tokens)", "seed_standard_mib": "standard (MiB)", "seed_flash_mib": "flash (MiB)",
          "seed_reduction_stated": "reduction stated", "seed_reduction": "reduction of these MiB"}
EXACT = {"N": "N (tokens)", "exact_standard_mib": "standard (MiB)", "exact_flash_tiled_mib": "flash, tiled (MiB)",
         "exact_flash_ideal_mib": "flash, ideal (MiB)", "exact_reduction": "reduction (standard / tiled)"}
for head, labels in (("**As the article states it**", STATED), ("**As its own per-tile formula counts it**", EXACT)):
    st.markdown(head)
    st.dataframe(table[list(labels)], hide_index=True, width="stretch",
                 column_config={c: st.column_config.NumberColumn(
                     lab, format="%d" if c == "N" else ("%.1f×" if "reduction" in c else "%.1f"))
                     for c, lab in labels.items()})
st.caption("One head, $d = 128$, $B_q = 128$, fp16; the article's “MB” are MiB ($2^{20}$ B). The article scaled "
           "its $N = 4096$ totals (standard by $(N/4096)^2$, flash's K/V re-reads linearly); its own per-tile "
           "formula grows Q, K, V, O linearly and the K/V re-reads as $N^2/B_q$, which gives the exact table.")

# -- the current trace's own count ----------------------------------------------------------------
st.subheader("Counted from the current trace")
try:
    src = sources.current_source(s)
    meta_t = src.trace.meta
    counted = hbm.tile_count_breakdown(src.trace)
    point = tile_count_point(src.trace)
    model = trace_traffic(meta_t)                 # the estimator at this recording's shape
    e = model["estimate"]
    shape = (f"B {e.batch}, H {e.heads} / H_kv {e.kv_heads}, N_q {e.n_q:,}, N_k {e.n_k:,}, D {e.head_dim}, "
             f"{e.dtype}")
    st.markdown(f"From the **{counted['tiles_visited']:,} K/V tiles the kernel visited** "
                f"({src.origin}; mask {meta_t['mask']}, blocks {meta_t['block_m']}×"
                f"{meta_t['block_n']}): Q {fmt_bytes(counted['q_read'])} + K {fmt_bytes(counted['k_read'])} + "
                f"V {fmt_bytes(counted['v_read'])} + O {fmt_bytes(counted['o_write'])} = "
                f"**{fmt_bytes(point['bytes'])}** (the cost model's tiled flash: {fmt_bytes(model['flash_tiled'])}).",
                help=f"exact: {point['bytes']:,} bytes counted; {model['flash_tiled']:,} tiled flash model")
    c = st.columns(3)
    c[0].metric("ideal flash (model)", fmt_bytes(model["flash_ideal"]),
                help=f"{model['flash_ideal']:,} B: Q and O with H = {e.heads} heads and N_q = {e.n_q:,} rows, "
                     f"K and V with H_kv = {e.kv_heads} heads and N_k = {e.n_k:,} rows, each once")
    c[1].metric("tiled flash (model)", fmt_bytes(model["flash_tiled"]),
                help=f"{model['flash_tiled']:,} B: Q and O once, each computed tile reads its K and V block")
    c[2].metric("naive (model)", fmt_bytes(model["naive"]),
                help=f"{model['naive']:,} B: Q, K, V, O once plus S and P (B·H·N_q·N_k each) written once "
                     "and read once")
    st.caption(f"Models from instrumentation.estimate at this recording's shape ({shape}; docs/formulas.md), "
               f"no caches. Ideal flash: K {fmt_bytes(e.k_bytes)} + V {fmt_bytes(e.v_bytes)} with H_kv heads, "
               f"Q {fmt_bytes(e.q_bytes)} + O {fmt_bytes(e.o_bytes)}. Naive: S and P of "
               f"{e.batch}×{e.heads}×{e.n_q:,}×{e.n_k:,} move {fmt_bytes(model['naive_sp'])}. "
               "Decimal units: 1 MB = 10⁶ B.")
    st.caption(src.trace.provenance())
except (sources.RunError, ValueError, KeyError) as exc:
    st.info(f"No trace to count from with the current settings: {exc}")

