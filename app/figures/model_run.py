"""A captured model run (instrumentation.hf.capture): where the attention time of a real
forward / generate went, by layer, by layer kind (sliding-window vs global), by forward pass
(prefill, then decode steps), and how the KV cache grew.

Every number is from the run itself or from `instrumentation.estimate`: kernel times are the
calls' untraced kernel medians (ModelCall.kernel_ms, do_bench on the GPU that recorded them);
tiles and KV-cache bytes are Estimate fields of each call's shape (with the blocks its trace
ran), so they match the trace's own tables (a prefill's work.tiles_visited sums to the tiles).

    table = call_table(run)                     # one row per call, with kind, tiles, KV bytes
    layer_figure(table, prov); layer_kind_figure(table, prov)
    steps_figure(table, prov); kv_cache_figure(table, prov)
"""

from __future__ import annotations

import functools

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from instrumentation import estimate as _estimate

from ._common import FULL, PARTIAL, TEMPLATE, caption, fmt_bytes, fmt_time_ms, title

# the same shape is estimated once (a training run's calls share a few shapes; the live page's table
# is rebuilt as the run grows): Estimate is a frozen dataclass, read only here
estimate = functools.lru_cache(maxsize=4096)(_estimate)
PHASE_COLOURS = {"prefill": FULL, "decode": PARTIAL}
KIND_COLOURS = {"global": "#3d7ab8", "sliding": "#59a14f"}
MIB = 2 ** 20
MODEL_DEVICE = "H100"      # the device whose modelled time stands in where a run has no measured one
STEP_AXIS = "forward pass: the prefill, then decode step k"
TOP_LEGEND = dict(orientation="h", x=1, y=1.1, xanchor="right", yanchor="bottom")   # right of the subtitle
TIMES = "kernel time: each call's untraced kernel, do_bench median"


def run_provenance(run, name: str = "", uploaded: bool = False) -> str:
    """Where a run's numbers come from: 'recorded model run NAME: Model on NVIDIA H200, 2026-11-26,
    transformers 5.17' (uploaded: 'uploaded model run FILE', its meta is the uploader's word)."""
    m = run.meta
    env = m.get("environment") or {}
    dev = env.get("device_name") or m.get("device", "?")
    if env.get("backend") not in (None, "cuda"):
        dev = "CPU interpreter (no hardware timing)"
    when = str(m.get("created", "?"))[:10]
    text = (f"{'uploaded' if uploaded else 'recorded'} model run{' ' + name if name else ''}: "
            f"{m.get('model', '?')} on {dev}, {when}, "
            f"transformers {m.get('transformers_version', '?')}")
    # Plotly draws <a>, <span style> in captions: an upload's file name is the uploader's word
    # (a loaded run's meta has no '<' or '>': ModelRun refuses it)
    return text.replace("<", "‹").replace(">", "›")


def _blocks(meta: dict) -> tuple[int, int]:
    """The (block_m, block_n) a call's trace ran with (a decode step's rows x keys per block)."""
    kernel = meta.get("kernel") or {}
    return int(meta.get("block_m") or kernel.get("block_m")), int(meta.get("block_n") or kernel.get("block_n"))


def call_tiles(call, meta: dict) -> int:
    """The tiles a call's kernel computed: Estimate.tiles_computed with the blocks its trace ran.
    A decode step packs the query heads of each KV head (H / H_kv heads x N_q rows,
    kernel.rows_per_kv_head) into the rows of one block, so its tiles are those of B x H_kv
    programs of that many rows over its N_k keys (one 16-row tile serves a whole GQA group;
    counting per query head gave H / H_kv times too many). Arguments: a ModelCall, its trace's
    meta. Returns the count."""
    bm, bn = _blocks(meta)
    if call.phase == "decode":
        rows = int((meta.get("kernel") or {}).get("rows_per_kv_head") or call.heads // call.kv_heads * call.n_q)
        e = estimate(call.batch, call.kv_heads, call.kv_heads, rows, call.n_k, call.head_dim, mask="full",
                     dtype=call.dtype, block_m=bm, block_n=bn)    # every packed row sees all N_k keys it was given
    else:
        e = estimate(call.batch, call.heads, call.kv_heads, call.n_q, call.n_k, call.head_dim, mask=call.mask,
                     dtype=call.dtype, block_m=bm, block_n=bn)
    return e.tiles_computed


def backward_tiles(call, backward: dict | None) -> int | None:
    """The tiles a call's traced backward computed: its trace meta's tiles per query head, dK/dV
    and dQ passes (what the backward's bwd_work table sums to), times B x H. None without a
    backward. Arguments: a ModelCall, its trace meta's 'backward' (or None). Returns the count."""
    per_head = (backward or {}).get("tiles_per_head") or {}
    if not per_head:
        return None
    return int(sum(int(per_head.get(p) or 0) for p in ("dkdv", "dq"))) * call.batch * call.heads


def call_table(run) -> pd.DataFrame:
    """One row per call: run.table()'s columns plus `kind` (sliding / global), `layer_label`,
    `tiles` (call_tiles: Estimate.tiles_computed with the call's blocks, a decode step's GQA group
    in one block), `kv_bytes` (Estimate.kv_cache_bytes: the K and V the call read), `kernel_us`
    and, for the watched page, `backward` (the trace has the backward), `model_us` /
    `model_bwd_us` (modelled forward / backward time on MODEL_DEVICE), `bwd_tiles`
    (backward_tiles), `flops` / `bwd_flops` (Estimate.flops / flops_backward) and `bwd_kernel_us`.

    Arguments: a ModelRun (its traces loaded or not: ModelRun.trace_meta reads the blocks).
    Returns a DataFrame (empty run: no rows)."""
    rows = []
    for i, c in enumerate(run.calls):
        e = estimate(c.batch, c.heads, c.kv_heads, c.n_q, c.n_k, c.head_dim, mask=c.mask, dtype=c.dtype)
        meta = run.trace_meta(i)
        fwd_s = e.time_by_device.get(MODEL_DEVICE, e.time_s)
        bwd = meta.get("backward") if isinstance(meta.get("backward"), dict) else None
        rows.append({"tiles": call_tiles(c, meta), "kv_bytes": e.kv_cache_bytes, "backward": bwd is not None,
                     "model_us": fwd_s * 1e6,
                     "model_bwd_us": fwd_s * 1e6 * e.flops_backward / e.flops if bwd is not None and e.flops else None,
                     "bwd_tiles": backward_tiles(c, bwd), "flops": e.flops,
                     "bwd_flops": e.flops_backward if bwd is not None else None})
    table = run.table()
    extra = pd.DataFrame(rows, index=table.index, columns=["tiles", "kv_bytes", "backward", "model_us", "model_bwd_us",
                                                           "bwd_tiles", "flops", "bwd_flops"])
    table = pd.concat([table, extra], axis=1)
    table["kind"] = ["global" if pd.isna(w) else "sliding" for w in table["window"]]
    # a call of a module without layer_idx has no layer (None): its own label, never dropped
    table["layer_label"] = [("no layer" if pd.isna(l) else f"L{int(l)}") + " · "
                            + ("global" if pd.isna(w) else f"window {int(w):,}")
                            for l, w in zip(table["layer"], table["window"])]
    table["kernel_us"] = table["kernel_ms"].astype(float) * 1e3
    table["bwd_kernel_us"] = table["bwd_kernel_ms"].astype(float) * 1e3
    return table


def _layers(table: pd.DataFrame) -> list[str]:
    return list(table.sort_values("layer").layer_label.drop_duplicates())


def tick_labels(labels) -> list[str]:
    """'L0 · window 256' as a bar's tick, 'L0 · W 256': one line short enough for a slide's width
    (two lines ran into the caption, a long line was rotated into it)."""
    return [str(x).replace("window ", "W ") for x in labels]


def per_layer(table: pd.DataFrame) -> pd.DataFrame:
    """Kernel time (µs) and tiles summed per (layer, phase): what layer_figure draws."""
    return table.groupby(["layer", "layer_label", "phase"], as_index=False, dropna=False)[["kernel_us", "tiles"]].sum()


def layer_figure(table: pd.DataFrame, provenance: str) -> go.Figure:
    """Per layer: kernel time and tiles of all its calls, prefill and decode stacked, side by side.

    Arguments: call_table(run), run_provenance(run). Returns the figure."""
    sums = per_layer(table)
    order = _layers(table)
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("kernel time per layer", "tiles computed per layer"))
    for phase in ("prefill", "decode"):
        part = sums[sums.phase == phase].set_index("layer_label").reindex(order)
        if part["kernel_us"].isna().all():
            continue
        n = int((table.phase == phase).sum() / max(len(order), 1))
        name = f"{phase} ({n} call{'s' if n != 1 else ''} per layer)"
        for col, (field, fmt) in enumerate((("kernel_us", lambda v: fmt_time_ms(v / 1e3)),
                                            ("tiles", lambda v: f"{v:,.0f} tiles")), start=1):
            vals = part[field].fillna(0)
            fig.add_trace(go.Bar(x=tick_labels(order), y=vals, name=name, legendgroup=phase, showlegend=col == 1, textangle=0,
                                 marker_color=PHASE_COLOURS[phase], text=[fmt(v) for v in vals],
                                 hovertemplate="%{x}: %{text}<extra>" + phase + "</extra>"), row=1, col=col)
    fig.update_layout(barmode="stack", template=TEMPLATE, height=460,
                      title=title("Attention per layer: kernel time and tiles",
                                  f"{len(table)} calls · {table.step.nunique()} forward passes"),
                      legend=TOP_LEGEND)
    fig.update_xaxes(title_text="layer (W: its sliding window in tokens)")
    fig.update_yaxes(title_text="kernel time (µs, all calls)", row=1, col=1)
    fig.update_yaxes(title_text="tiles computed (all calls)", row=1, col=2)
    return caption(fig, f"Data: {provenance}. {TIMES}; tiles: Estimate.tiles_computed of each call's shape "
                        "and blocks (a prefill's trace counts the same in work.tiles_visited; a decode step packs "
                        "each KV head's query heads into one block's rows, one tile per KV head and key block).")


def layer_kind_figure(table: pd.DataFrame, provenance: str) -> go.Figure:
    """Sliding-window vs global layers side by side: mean kernel time and keys read per call, in
    prefill and in decode.

    Arguments: call_table(run), run_provenance(run). Returns the figure."""
    means = table.groupby(["kind", "phase"], as_index=False).agg(kernel_us=("kernel_us", "mean"),
                                                                 n_k=("n_k", "mean"), calls=("index", "count"))
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("kernel time per call (mean)", "keys read per call (mean N_k)"))
    phases = [p for p in ("prefill", "decode") if p in set(table.phase)]
    for kind in ("sliding", "global"):
        part = means[means.kind == kind].set_index("phase").reindex(phases)
        if part["calls"].isna().all():
            continue
        windows = sorted({int(w) for w in table.loc[table.kind == kind, "window"].dropna()})
        name = "global layers" if kind == "global" else f"sliding layers (window {', '.join(f'{w:,}' for w in windows)})"
        for col, (field, fmt) in enumerate((("kernel_us", lambda v: fmt_time_ms(v / 1e3)),
                                            ("n_k", lambda v: f"{v:,.0f} keys")), start=1):
            vals = part[field]
            fig.add_trace(go.Bar(x=phases, y=vals, name=name, legendgroup=kind, showlegend=col == 1, textangle=0,
                                 marker_color=KIND_COLOURS[kind], text=[fmt(v) if pd.notna(v) else "" for v in vals],
                                 customdata=part["calls"].fillna(0).astype(int),
                                 hovertemplate="%{x}: %{text} (%{customdata} calls)<extra>" + kind + "</extra>"),
                          row=1, col=col)
    kinds = set(table.kind)
    note = ("every layer of this model is global (no sliding-window layers)" if kinds == {"global"} else
            "every layer has a sliding window" if kinds == {"sliding"} else
            "a sliding layer's decode step reads only its last W keys")
    fig.update_layout(barmode="group", template=TEMPLATE, height=460,
                      title=title("Sliding-window vs global layers", note),
                      legend=TOP_LEGEND)
    fig.update_xaxes(title_text="phase")
    fig.update_yaxes(title_text="kernel time per call (µs)", row=1, col=1)
    fig.update_yaxes(title_text="keys per call (N_k)", row=1, col=2)
    return caption(fig, f"Data: {provenance}. {TIMES}; keys: the N_k each call's kernel read.")


def per_step(table: pd.DataFrame) -> pd.DataFrame:
    """Per forward pass: its phase, kernel time (µs, all layers) and KV bytes per layer kind."""
    out = table.groupby("step", as_index=False).agg(phase=("phase", "first"), kernel_us=("kernel_us", "sum"),
                                                    n_k=("n_k", "max"))
    for kind in ("global", "sliding"):
        kv = table[table.kind == kind].groupby("step").kv_bytes.sum()
        out[f"kv_{kind}"] = out.step.map(kv).fillna(0).astype("int64")
    return out


def _step_labels(steps: pd.DataFrame) -> list[str]:
    return ["prefill" if p == "prefill" else str(int(s)) for s, p in zip(steps.step, steps.phase)]


def steps_figure(table: pd.DataFrame, provenance: str) -> go.Figure:
    """Attention kernel time of each forward pass (all layers): the prefill, then each decode step.

    Arguments: call_table(run), run_provenance(run). Returns the figure."""
    steps = per_step(table)
    labels = _step_labels(steps)
    fig = go.Figure()
    for phase in ("prefill", "decode"):
        mask = steps.phase == phase
        fig.add_trace(go.Bar(x=[l for l, m in zip(labels, mask) if m], y=steps.kernel_us[mask], name=phase,
                             marker_color=PHASE_COLOURS[phase],
                             text=[fmt_time_ms(v / 1e3) for v in steps.kernel_us[mask]],
                             customdata=steps.n_k[mask], textangle=0,
                             textfont=dict(size=11 if len(steps) > 12 else 13),
                             hovertemplate="%{x}: %{text}, N_k up to %{customdata:,}<extra></extra>"))
    prefill = steps[steps.phase == "prefill"]
    decode = steps[steps.phase == "decode"]
    sub = (f"prefill {fmt_time_ms(prefill.kernel_us.sum() / 1e3)} · "
           f"{len(decode)} decode steps, {fmt_time_ms(decode.kernel_us.mean() / 1e3) if len(decode) else '—'} each (mean)")
    fig.update_layout(template=TEMPLATE, height=440, title=title("Attention time per forward pass", sub),
                      xaxis=dict(title_text=STEP_AXIS, type="category", tickangle=0),
                      yaxis=dict(title_text="kernel time, all layers (µs)"),
                      legend=TOP_LEGEND)        # at the left it sat on the subtitle
    return caption(fig, f"Data: {provenance}. {TIMES}, summed over the layers of each forward pass.")


def kv_cache_figure(table: pd.DataFrame, provenance: str) -> go.Figure:
    """KV-cache bytes the attention read in each forward pass, all layers, global and sliding
    layers stacked: a global layer's cache grows by one token a decode step, a sliding layer's
    stays at its window.

    Arguments: call_table(run), run_provenance(run). Returns the figure; y values are sums of
    Estimate.kv_cache_bytes."""
    steps = per_step(table)
    labels = _step_labels(steps)
    fig = go.Figure()
    for kind in ("global", "sliding"):
        col = steps[f"kv_{kind}"]
        if not col.any():
            continue
        fig.add_trace(go.Scatter(x=labels, y=col / MIB, name=f"{kind} layers", stackgroup="kv", mode="lines+markers",
                                 line=dict(color=KIND_COLOURS[kind], width=2),
                                 text=[fmt_bytes(v, binary=True) for v in col],
                                 hovertemplate="%{x}: %{text}<extra>" + kind + " layers</extra>"))
    total = steps.kv_global + steps.kv_sliding
    fig.update_yaxes(title_text="KV cache read, all layers (MiB = 2²⁰ B)", rangemode="tozero")
    grow = int(total.iloc[-1] - total.iloc[0]) if len(total) > 1 else 0
    sub = (f"{fmt_bytes(total.iloc[0], binary=True)} read by the prefill → {fmt_bytes(total.iloc[-1], binary=True)} "
           f"by the last step ({'+' if grow >= 0 else '−'}{fmt_bytes(abs(grow), binary=True)})")
    fig.update_layout(template=TEMPLATE, height=440, title=title("KV cache over the decode steps", sub),
                      xaxis=dict(title_text=STEP_AXIS, type="category", tickangle=0),
                      legend=TOP_LEGEND)        # at the left it sat on the subtitle
    return caption(fig, f"Data: {provenance}; bytes: Estimate.kv_cache_bytes of each call's shape "
                        "(2 × B × H_kv × N_k × D × bytes per element), summed over the layers. A global layer's "
                        "cache grows one token a decode step; a sliding layer's decode reads only its last W keys.")
