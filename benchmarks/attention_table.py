"""benchmarks.attention's tables: one row per record with its time ratios (ratio_table), the
printed form (format_table) and the (mask, N) x impl summary (summary_pivot)."""

from __future__ import annotations

from . import mask_kind
from .attention_impls import IMPLS, SDPA_MASKS

TABLE_COLUMNS = ["mask", "seq_len", "impl", "status", "ms", "tflops", "pct_matmul", "rel_err",
                 "x_cudnn", "x_full", "x_flex", "tiles_frac", "pairs_frac", "config"]


def ratio_table(records, mask_order=None, impl_order=IMPLS, matmul=None):
    """Arguments: records, the result file's records; mask_order and impl_order, the row order;
    matmul, the measured matmul TFLOP/s or None. Returns: a pandas table (TABLE_COLUMNS), one row
    per record: x_cudnn = ms / sdpa_cudnn's ms at the same (mask, N);
    x_full = ms / the same impl's ms with the full mask at the same N; pct_matmul = tflops as a
    percentage of the measured bf16 matmul peak."""
    import pandas as pd

    df = pd.DataFrame(records)
    if df.empty:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    ok = df[(df["status"] == "ok") & df["ms"].notna()]
    cudnn = {(m, n): ms for m, n, ms in ok.loc[ok["impl"] == "sdpa_cudnn", ["mask", "seq_len", "ms"]]
             .itertuples(index=False)}
    full = {(i, n): ms for i, n, ms in ok.loc[ok["mask"] == "full", ["impl", "seq_len", "ms"]]
            .itertuples(index=False)}
    flex = {(m, n): ms for m, n, ms in ok.loc[ok["impl"] == "flex", ["mask", "seq_len", "ms"]]
            .itertuples(index=False)}
    df["x_flex"] = [ms / flex[(m, n)] if (m, n) in flex and pd.notna(ms) else None
                    for m, n, ms in zip(df["mask"], df["seq_len"], df["ms"])]
    df["x_cudnn"] = [ms / cudnn[(m, n)] if (m, n) in cudnn and pd.notna(ms) else None
                     for m, n, ms in zip(df["mask"], df["seq_len"], df["ms"])]
    df["x_full"] = [ms / full[(i, n)] if (i, n) in full and pd.notna(ms) else None
                    for i, n, ms in zip(df["impl"], df["seq_len"], df["ms"])]
    df["pct_matmul"] = (df["tflops"].astype(float) / matmul * 100.0) if matmul else None
    for col in TABLE_COLUMNS:
        if col not in df:
            df[col] = None
    df["config"] = [_cfg_text(c) for c in df["config"]]
    masks = list(dict.fromkeys(mask_order or df["mask"]))
    df["_m"] = df["mask"].map({m: i for i, m in enumerate(masks)}).fillna(len(masks))
    df["_i"] = df["impl"].map({m: i for i, m in enumerate(impl_order)}).fillna(len(impl_order))
    df = df.sort_values(["_m", "seq_len", "_i"], kind="stable")
    return df[TABLE_COLUMNS].reset_index(drop=True)


def _cfg_text(cfg) -> str:
    if not isinstance(cfg, dict):
        return ""
    loop = {"warp-specialised": " ws", "split": " split"}.get(cfg.get("loop"), "")    # the FP8 kernel's records
    kind = "gluon " if cfg.get("kernel") == "gluon" else ""                              # kernels.gluon_launch
    return f"{kind}{cfg['block_m']}x{cfg['block_n']} w{cfg['num_warps']} s{cfg['num_stages']}{loop}"


def format_table(df) -> str:
    """The table as text. Arguments: df, ratio_table's output. Returns: its rows, numbers rounded."""
    import pandas as pd

    fmt = {"ms": "{:.3f}", "tflops": "{:.1f}", "pct_matmul": "{:.0f}%", "rel_err": "{:.1e}",
           "x_cudnn": "{:.2f}", "x_full": "{:.2f}", "x_flex": "{:.2f}", "tiles_frac": "{:.3f}", "pairs_frac": "{:.3f}"}
    out = df.copy()
    for col, f in fmt.items():
        out[col] = [f.format(x) if x is not None and not pd.isna(x) else "" for x in out[col]]
    return out.to_string(index=False)


def summary_pivot(df):
    """Arguments: df, ratio_table's output. Returns: the (mask, N) x impl matrix of x_cudnn (where
    SDPA exists) or x_full (other masks), with tiles_frac beside it."""
    import pandas as pd

    if df.empty:
        return pd.DataFrame()
    sdpa_mask = df["mask"].map(lambda m: mask_kind(m) in SDPA_MASKS)
    val = df["x_cudnn"].where(sdpa_mask, df["x_full"]).astype(float)
    piv = df.assign(ratio=val).pivot_table(index=["mask", "seq_len"], columns="impl", values="ratio",
                                           sort=False, dropna=False)
    piv = piv[[c for c in IMPLS if c in piv.columns]]
    tiles = df.dropna(subset=["tiles_frac"]).groupby(["mask", "seq_len"], sort=False)["tiles_frac"].first()
    piv["tiles_frac"] = tiles.reindex(piv.index).astype(float)
    return piv
