"""Page: your model. What one attention layer of a published model (kernels.presets) or of a
shape you type costs at N tokens, up to 1M: naive vs flash peak memory against the H100's and
the H200's memory, HBM traffic, FLOPs, modelled time and the KV cache, all from the analytic
model `instrumentation.estimate` (docs/formulas.md, quoted at the bottom), with a link to the
nearest real recording of that model. Arithmetic only: the page never runs a kernel.
The page's controls live in the URL (ym_* parameters, app.url_state.control).
"""

import math
import re
from urllib.parse import urlencode

import streamlit as st

from app import settings, sources, url_state, watch_hint
from app.figures._common import fmt_bytes, fmt_memory, fmt_time_ms
from app.figures.estimate import (N_MAX, N_MIN, Problem, device_sweeps, estimate_at, flops_figure, measured_at,
                                  measured_naive, measured_points, naive_fits, naive_verdicts, numbers_at_n,
                                  peak_memory_figure, short, time_figure, traffic_figure)
from app.text import plain
from app.views import common
from instrumentation.analysis.estimator import DEVICES
from kernels.presets import PRESETS

CUSTOM = "custom"
N_CHOICES = [2 ** k for k in range(int(math.log2(N_MIN)), int(math.log2(N_MAX)) + 1)]
WINDOW = "window"                  # the mask option whose window W the page's own control sets
FORMULAS = sources.bundled.REPO_ROOT / "docs" / "formulas.md"
QUOTED = ("naive_sp_bytes", "naive_peak_bytes", "flash_peak_bytes", "kv_cache_bytes", "naive_hbm_bytes",
          "flash_hbm_bytes", "flash_tiled_hbm_bytes", "flops", "flops_tiles", "flops_dense")

s = settings.current()
st.title("Your model")
st.caption("What one attention layer of your model costs at N tokens (forward, one call): memory, HBM traffic, "
           "FLOPs and time, naive vs flash. Every number here is the **analytic model** "
           "`instrumentation.estimate` (formulas at the bottom); nothing runs.")


def n_label(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}k" if n >= 1024 else str(n)


@st.cache_data(show_spinner=False, max_entries=64)
def sweeps(p: Problem, n: int) -> dict:
    """{device: [Estimate over N]} (N from 256 to 1M and the chosen N), cached per shape."""
    return device_sweeps(p, n)


@st.cache_data(show_spinner=False, max_entries=8)
def _sweep_file(path: str, mtime: float) -> tuple:
    from instrumentation.trace.sweep_file import load_sweep

    meta, df = load_sweep(path)
    return meta, df.to_dict("records")


def bundled_sweeps() -> list[tuple]:
    """(label, meta, records) of every bundled naive-vs-flash sweep (data/sweeps/*.json), for
    measured_naive: a measurement of exactly the chosen shape decides whether naive fits."""
    out = []
    for path in sources.discover_sweeps():
        try:
            meta, records = _sweep_file(str(path), path.stat().st_mtime)
        except (OSError, ValueError):
            continue               # the Memory page says what is wrong with a sweep file
        out.append((f"{path.parent.name}/{path.name}", meta, records))
    return out


@st.cache_data(show_spinner=False, max_entries=8)
def formula_rows(path: str, mtime: float) -> dict:
    """{field: (term, formula)} from docs/formulas.md's table rows that name an Estimate field."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("|") and len(cells) >= 2:
                for field in re.findall(r"\[`(\w+)`", cells[0]):
                    out.setdefault(field, (cells[0], cells[1]))
    return out


def nearest_recording(preset_name: str, p: Problem, n: int):
    """The bundled recording nearest this model at N: a `preset-<name>_…` one of the same preset
    when there is one (the same mask first, then the nearest N_k, a GPU one before an interpreter
    one), else the recording nearest the shape (bundled.distance). Returns a Recording or None."""
    recs = sources.recordings()
    own = [r for r in recs if r.name.startswith(f"preset-{preset_name}_")] if preset_name != CUSTOM else []
    if own:
        def far(r):
            n_k = int(r.meta.get("shape", {}).get("N_k") or r.seq_len or 1)
            return (r.mask != p.mask, abs(math.log2(max(n_k, 1)) - math.log2(n)), not r.is_gpu, r.name)
        return min(own, key=far)
    want = {"seq_len": p.lengths(n)[0], "mask": p.mask, "head_dim": p.head_dim, "heads": p.heads,
            "kv_heads": 0 if p.kv_heads == p.heads else p.kv_heads, "batch": p.batch}
    return sources.nearest(recs, want)


# -- controls (page-level, kept in the URL) --------------------------------------------------------
names = [*PRESETS, CUSTOM]
# presentation: the controls fold into the faint "Controls" pill (app/presentation.py), so the first
# chart is a whole slide at 1280 x 720 (above it they pushed its axis off the screen)
controls = st.expander("Controls", expanded=False, icon=":material/tune:", key="slide_controls") if s.present \
    else st.container()
c = controls.columns([2.5, 1, 2, 2.5, 1])
url_state.control("ym_preset", "llama-3-8b", options=names)
name = c[0].selectbox("model", names, key="ym_preset",
                      format_func=lambda k: PRESETS[k].label if k in PRESETS else "custom shape (H, H_kv, D)")
preset = PRESETS.get(name)
url_state.control("ym_batch", 1, int, bounds=(1, 4096))
batch = c[1].number_input("batch B", 1, 4096, key="ym_batch")
url_state.control("ym_n", 32768, int, options=N_CHOICES)
chunk = preset.n_q if preset is not None and preset.n_q else None
n = c[2].select_slider("context N (keys)" if chunk else "sequence length N", N_CHOICES, key="ym_n",
                       format_func=n_label,
                       help=f"this preset's chunk is {chunk} queries against N keys" if chunk else "N_q = N_k = N")
own_masks = list(dict.fromkeys(preset.masks)) if preset is not None else []
mask_options = list(dict.fromkeys([*own_masks, "causal", "full", WINDOW]))
layer_kind = {m: ("the model's sliding-window layers" if m.startswith("sliding_window") else "the model's layers")
              for m in own_masks}
if len(own_masks) > 1:      # alternating local and global layers (Gemma-2)
    layer_kind = {m: ("the model's local layers" if m.startswith("sliding_window") else "the model's global layers")
                  for m in own_masks}
url_state.control("ym_mask", mask_options[0], options=mask_options)
mask_choice = c[3].selectbox("mask", mask_options, key="ym_mask",
                             format_func=lambda m: "sliding window, W tokens (set W)" if m == WINDOW
                             else f"{m} — {layer_kind[m]}" if m in layer_kind else m)
url_state.control("ym_dtype", "bf16", options=list(settings.DTYPES))
dtype = c[4].selectbox("dtype", settings.DTYPES, key="ym_dtype")

heads, kv_heads, head_dim = (preset.heads, preset.kv_heads, preset.head_dim) if preset is not None else (0, 0, 0)
extra = controls.columns(4) if name == CUSTOM or mask_choice == WINDOW else None
if name == CUSTOM:
    url_state.control("ym_heads", 32, int, bounds=(1, 1024))
    heads = extra[0].number_input("query heads H", 1, 1024, key="ym_heads")
    url_state.control("ym_kv_heads", 8, int, bounds=(1, 1024))
    kv_heads = extra[1].number_input("KV heads H_kv", 1, 1024, key="ym_kv_heads",
                                     help="H must be a multiple of H_kv (GQA); 1 = MQA, H = MHA")
    url_state.control("ym_head_dim", 128, int, bounds=(1, 256))
    head_dim = extra[2].number_input("head dim D", 1, 256, key="ym_head_dim")
mask = mask_choice
if mask_choice == WINDOW:
    url_state.control("ym_window", 4096, int, bounds=(1, N_MAX))
    window = extra[3].number_input("window W (tokens)", 1, N_MAX, key="ym_window")
    mask = f"sliding_window:{int(window)}"

p = Problem(int(batch), int(heads), int(kv_heads), int(head_dim), mask, dtype, chunk,
            preset.label if preset is not None else "custom shape")
try:
    ests = sweeps(p, int(n))
    h100, h200 = (estimate_at(p, int(n), dev) for dev in ("H100", "H200"))
except ValueError as exc:
    st.error(plain(f"This shape cannot be estimated: {exc}."), icon=":material/error:")
    st.stop()

# -- the numbers at N ----------------------------------------------------------------------------
st.markdown(f"**{plain(p.label)}** · {plain(p.brief(int(n)))} · tiles {h100.block_m}×{h100.block_n}")
m = common.metric_columns(6, s.present)
m[0].metric("naive peak", short(fmt_memory(h100.naive_peak_bytes)),
            help=f"naive peak memory: {h100.naive_peak_bytes:,} B, S and P of (B, H, N_q, N_k), both resident, plus "
                 "K and V repeated to H heads (GQA)")
m[1].metric("flash peak", short(fmt_memory(h100.flash_peak_bytes)),
            help=f"flash peak memory: {h100.flash_peak_bytes:,} B, O and lse")
m[2].metric("KV cache", short(fmt_memory(h100.kv_cache_bytes)),
            help=f"KV cache of this layer (K and V of N_k tokens, H_kv heads): {h100.kv_cache_bytes:,} B")
m[3].metric("flash HBM", short(fmt_bytes(h100.flash_hbm_bytes)),
            help=f"HBM traffic of ideal flash (Q, K, V, O once): {h100.flash_hbm_bytes:,} B; naive moves "
                 f"{h100.naive_hbm_bytes:,} B")
measured = measured_points([(r.name, r.meta) for r in sources.recordings()], p)
for col, dev, e in ((m[4], "H100", h100), (m[5], "H200", h200)):
    seen = measured_at(measured, int(n), dev)       # a recording of this very shape and N on that card
    # a recording at other tiles than the default the model prices says so on the tile itself
    other_tiles = seen and (seen["block_m"], seen["block_n"]) != (e.block_m, e.block_n)
    col.metric(f"{dev} modelled", short(fmt_time_ms(e.time_by_device[dev] * 1e3)),
               (f"measured {short(fmt_time_ms(seen['measured_ms']))}"
                + (f" at {seen['block_m']}×{seen['block_n']}" if other_tiles else "")) if seen else None,
               delta_color="off", delta_arrow="off",
               help=f"modelled time of one flash call. {e.model_note}."
                    + (f" Measured: {seen['measured_ms']:.4g} ms, untraced do_bench median of the recording "
                       f"{seen['name']} ({seen['device_name']}, {seen['date']}) at {seen['block_m']}×{seen['block_n']} "
                       f"tiles" + (f", not the default {e.block_m}×{e.block_n} modelled here (the model at "
                                   f"its tiles: {seen['model_ms']:.4g} ms)." if other_tiles else ".") if seen else
                       " No recording of this shape and N on this card is bundled."))
if len(own_masks) > 1 and not s.present:     # Gemma-2: one layer kind at a time above; both kinds side by side here
    kinds = []
    for km in own_masks:
        ke = estimate_at(Problem(p.batch, p.heads, p.kv_heads, p.head_dim, km, p.dtype, p.chunk), int(n), "H100")
        kind = layer_kind[km].split("'s ", 1)[1]            # "the model's local layers" -> "local layers"
        kinds.append(f"{kind} ({km}) {fmt_time_ms(ke.time_s * 1e3)} and "
                     f"{ke.tiles_computed:,} tiles a call")
    st.caption(f"{plain(p.label)} alternates its layers; at N = {n_label(int(n))} on the H100 (modelled): "
               + "; ".join(kinds) + ". Pick a layer kind in **mask**.")
# a bundled sweep's run of exactly this shape and N overrides "fits on paper" (measured: out of memory)
naive_runs = measured_naive(bundled_sweeps(), p)
cards = {"H100": h100, "H200": h200}
fit = naive_fits(cards, int(n), naive_runs)
verdicts = naive_verdicts(cards, int(n), naive_runs)
said = [f"the {d}: {v}" for d, v in verdicts.items() if v.startswith("measured")]
fits = [f"the {d}" for d in cards if fit[d]]
if (len(fits) < 2 or said) and not s.present:     # on slides the memory chart's marks and caption say it
    st.warning(f"Naive attention needs {fmt_memory(h100.naive_peak_bytes)} beyond Q, K and V at "
               f"N = {n_label(int(n))}: it " + (f"fits {fits[0]} only" if len(fits) == 1 else
                                                "fits both the H100 and the H200" if fits else
                                                "fits neither the H100 nor the H200")
               + (f" ({'; '.join(said)})" if said else "")
               + f". Flash needs {fmt_memory(h100.flash_peak_bytes)}.", icon=":material/memory:")

rec = nearest_recording(name, p, int(n))
if rec is not None:
    link = "./schedule?" + urlencode({"page": "schedule", "source": "recorded", "trace": rec.name})
    own = rec.name.startswith(f"preset-{name}_")
    point = next((r for r in measured if r["name"] == rec.name), None)
    timed = (f" Measured there: **{fmt_time_ms(point['measured_ms'])}** (untraced, do_bench median) against "
             f"{fmt_time_ms(point['model_ms'])} modelled for its shape and tiles." if point else "")
    if point and (point["block_m"], point["block_n"]) != (h100.block_m, h100.block_n) and point["n"] == int(n):
        timed += (f" It ran {point['block_m']}×{point['block_n']} tiles, not the kernel's default "
                  f"{h100.block_m}×{h100.block_n} the model is fitted at.")
    st.markdown(f"{'Nearest real recording of this model' if own else 'No recording of this shape is bundled; nearest'}: "
                f"[{rec.name}]({link}) ({plain(rec.label.split(' — ', 1)[-1])}; opens the tile schedule).{timed}")

# -- charts --------------------------------------------------------------------------------------
common.chart(peak_memory_figure(ests, int(n), p, naive_runs), "your-model-peak-memory", "ym_memory", s.present)
common.chart(traffic_figure(ests["H100"], int(n), p), "your-model-hbm-traffic", "ym_traffic", s.present)
common.chart(flops_figure(ests["H100"], int(n), p), "your-model-flops", "ym_flops", s.present)
common.chart(time_figure(ests["H100"], int(n), p, measured), "your-model-time", "ym_time", s.present)

# -- the table and the formulas ------------------------------------------------------------------
st.subheader(f"The numbers at N = {n_label(int(n))}")
table = numbers_at_n(h100, h200, naive_runs)
st.dataframe(table, hide_index=True, width="stretch", height=35 * (len(table) + 1) + 3,   # every row, no scrolling
             column_config={"quantity": "quantity", "value": "value", "exact": "exact",
                            "field": st.column_config.TextColumn("Estimate field", help="docs/formulas.md")})
st.caption("Decimal units for traffic (1 GB = 10⁹ B), binary for memory (1 GiB = 2³⁰ B); FLOPs count 2 per "
           "multiply-add.")
with st.expander("Formulas (quoted from docs/formulas.md)", expanded=False):
    try:
        rows = formula_rows(str(FORMULAS), FORMULAS.stat().st_mtime)
    except OSError:
        rows = {}
    quoted = [(rows[f][0], rows[f][1]) for f in QUOTED if f in rows]
    if quoted:
        st.markdown("| term | formula |\n|---|---|\n" + "\n".join(f"| {a} | {b} |" for a, b in quoted))
    st.markdown("**Time model**, as each device's Estimate.model_note says it:\n\n"
                + "\n".join(f"- {plain(estimate_at(p, int(n), d).model_note)}." for d in DEVICES))
    st.markdown("All of them, with the symbols, the tile rule and the time model's constants: `docs/formulas.md` "
                "in the repository.")
st.subheader("Your own model, running")
st.caption("These numbers are arithmetic. To see your model's real attention kernels, tile by tile, watch its "
           "training (or capture a forward / generate) and open the Model run page:")
watch_hint.watch_snippet(expanded=True)
