"""Serving figures drawn from recordings (the page and the export command draw through these):
a paged decode trace's block table, page walk and cache bytes; a varlen trace beside the same
batch padded (a record() trace) or, without one, the estimator's padded batch."""

from __future__ import annotations

import pandas as pd

from . import serving as fig_paged
from . import serving_varlen as fig_varlen

PAGE_SIZES = (8, 16, 32, 64, 128, 256)


def paged_tables(trace) -> dict:
    """What the paged figures need from a decode trace with meta `paged`: the block table's
    frame, lengths, page size, pool size, shape, dtype. ValueError when the trace is not paged."""
    from instrumentation.analysis.kv_cache import block_table_frame

    paged = trace.meta.get("paged")
    if not paged or not hasattr(trace, "pages"):
        raise ValueError("this recording has no block table: record a paged decode step "
                         "(record_decode(..., block_table=...))")
    lens = [int(x) for x in trace.meta["cache_seqlens"]]
    return dict(frame=block_table_frame(paged["block_table"], lens, paged["page_size"]), lengths=lens,
                page_size=int(paged["page_size"]), num_pages=int(paged["num_pages"]),
                table_tokens=int(paged["max_blocks"]) * int(paged["page_size"]),
                shape=trace.meta["shape"], dtype=trace.meta["dtype"])


def _check_seq(b: int, n: int) -> int:
    if not 0 <= int(b) < n:
        raise ValueError(f"sequence {b} is not in this recording: use 0..{n - 1}")
    return int(b)


def block_table_figure_for(trace, follow: int = 0):
    """The block table picture of a paged decode trace, with sequence `follow`'s lookups."""
    t = paged_tables(trace)
    return fig_paged.block_table_figure(t["frame"], t["num_pages"], t["page_size"], trace.provenance(),
                                        _check_seq(follow, len(t["lengths"])))


def page_walk_figure_for(trace, b: int = 0):
    """Sequence b's programs reading their pages over time (modelled lanes without a clock)."""
    from instrumentation.analysis import decode_model as dm
    from instrumentation.analysis.serving import page_read_times

    from .decode import decode_setting

    t = paged_tables(trace)
    b = _check_seq(b, len(t["lengths"]))
    s = decode_setting(trace)
    lanes = trace.splits if s["hw"] else dm.modelled_timeline(trace.splits, s["sm_count"], s["gbps"],
                                                             sm_max_gbps=dm.SM_STREAM_GBPS)
    reads = page_read_times(trace.pages[trace.pages["b"] == b], lanes, t["page_size"])
    reads = reads.merge(t["frame"][["b", "logical_block", "sharers"]], on=["b", "logical_block"], how="left")
    prov = trace.provenance() + ("" if s["hw"] else f"; programs' times modelled on {s['sm_count']} SMs "
                                 f"sharing {s['gbps']:.0f} GB/s ({s['ceiling']})")
    return fig_paged.page_walk_figure(reads, prov, not s["hw"], b)


def cache_bytes_for(trace, max_len: int | None = None) -> tuple:
    """(CacheBytes counted from the trace's block table, {page size: CacheBytes} of the same
    lengths and shared prefix at PAGE_SIZES); max_len: the contiguous reserve (default: the
    table's width in tokens)."""
    from instrumentation.analysis.kv_cache import paged_cache_bytes, table_cache_bytes

    t = paged_tables(trace)
    sh = t["shape"]
    max_len = t["table_tokens"] if max_len is None else int(max_len)
    acc = table_cache_bytes(trace.meta["paged"]["block_table"], t["lengths"], t["page_size"], sh["H_kv"],
                            sh["D"], t["dtype"], max_len=max_len)
    prefix = shared_prefix_of(trace, acc)
    return acc, {p: paged_cache_bytes(t["lengths"], p, sh["H_kv"], sh["D"], t["dtype"], shared_prefix=prefix,
                                      max_len=max_len) for p in PAGE_SIZES}


def shared_prefix_of(trace, acc=None) -> int:
    """The tokens a paged trace's sequences share: meta serving.shared_prefix when the block table
    agrees with it at the recorded page size, else the whole pages the table shares (a prefix
    that ends inside a page is then counted short). acc: its table_cache_bytes, if at hand."""
    from instrumentation.analysis.kv_cache import paged_cache_bytes, table_cache_bytes

    t = paged_tables(trace)
    if len(t["lengths"]) == 1:
        return 0                          # one sequence shares nothing
    if acc is None:
        acc = table_cache_bytes(trace.meta["paged"]["block_table"], t["lengths"], t["page_size"], 1, 1, "fp32")
    whole = acc.shared_pages * t["page_size"]
    rec = (trace.meta.get("serving") or {}).get("shared_prefix")
    if not isinstance(rec, int) or not 0 <= rec <= max(t["lengths"]):
        return whole
    f = paged_cache_bytes(t["lengths"], t["page_size"], 1, 1, "fp32", shared_prefix=rec)
    return rec if (f.pages, f.stored_tokens) == (acc.pages, acc.stored_tokens) else whole


def _bytes_source(trace) -> str:
    sh = trace.meta["shape"]
    return (f"{trace.provenance()}; H_kv {sh['H_kv']}, D {sh['D']}, {trace.meta['dtype']}, the recording's "
            "block table and lengths")


def cache_bytes_figure_for(trace, max_len: int | None = None):
    return fig_paged.cache_bytes_figure(cache_bytes_for(trace, max_len)[0], _bytes_source(trace))


def page_size_figure_for(trace):
    return fig_paged.page_size_figure(cache_bytes_for(trace)[1], _bytes_source(trace), shared_prefix_of(trace))


# -- varlen --------------------------------------------------------------------------------------

def varlen_shape(trace) -> dict:
    v = trace.meta.get("varlen")
    if not v:
        raise ValueError("this recording is not a varlen batch: record one with instrumentation.record_varlen")
    return dict(lengths=[int(x) for x in v["lengths_q"]], heads=int(trace.meta["shape"]["H"]),
                block_m=int(trace.meta["block_m"]))


def varlen_lanes_for(packed, padded=None, sms: int | None = None):
    """(packed items, padded items or None, SM lanes, time unit, modelled) on one clock: the
    recordings' own clocks when both have hardware timing, else both modelled (tile-units). Each
    item says whether it is a tile-traced head's (tile_traced: traced_items.traced_item_mask)."""
    from instrumentation.analysis.schedule_model import timeline
    from instrumentation.analysis.serving import varlen_items
    from instrumentation.analysis.traced_items import traced_item_mask

    v = varlen_shape(packed)
    hw = packed.has_hw_timing and (padded is None or padded.has_hw_timing)
    sms = sms or (packed.meta.get("sm_count") if hw else None)

    def items(trace):
        tl = trace.work if hw else timeline(trace, sms=sms)
        lanes = tl.assign(seq=trace.work["seq"].to_numpy()) if "seq" in trace.work else tl
        out = varlen_items(lanes, v["lengths"], int(trace.meta["block_m"]), v["heads"])   # each its own tile
        out["tile_traced"] = traced_item_mask(trace)       # varlen_items keeps the rows' order
        if hw:
            t0 = float(out["t_start"].min())
            out = out.assign(t_start=(out["t_start"] - t0) / 1e3, t_end=(out["t_end"] - t0) / 1e3)
        return out
    a = items(packed)
    b = items(padded) if padded is not None else None
    lanes = int(max(a["sm"].max(), -1 if b is None else b["sm"].max())) + 1
    n_sms = int(sms or (lanes if hw else timeline(packed).attrs["sms"]))
    return a, b, max(n_sms, lanes), ("µs" if hw else "modelled tile-units"), not hw


def varlen_lanes_note(packed, padded=None) -> str:
    """Which launch drew each batch's work items (traced_items.launch_note), one line per batch."""
    from instrumentation.analysis.traced_items import launch_note

    if padded is None:
        return launch_note(packed)
    return f"Packed: {launch_note(packed)} Padded: {launch_note(padded)}"


def varlen_lanes_figure_for(packed, padded=None, sms: int | None = None):
    """The varlen lanes chart of the recordings: the tile-traced heads' items outlined, the caption
    saying which launch drew the work items (varlen_lanes_note)."""
    from instrumentation.analysis.traced_items import tile_traced_heads

    a, b, n_sms, unit, modelled = varlen_lanes_for(packed, padded, sms)
    prov = f"packed: {packed.provenance()}" + (f"; padded: {padded.provenance()}" if padded is not None else "")
    if modelled:
        prov += (f"; lanes modelled (instrumentation.analysis.schedule_model: list scheduling on {n_sms} SMs, "
                 "time ∝ tiles visited)")
    heads = sorted(set(tile_traced_heads(packed)) | set(tile_traced_heads(padded) if padded is not None else []))
    vl = packed.meta.get("varlen") or {}
    label = None
    if isinstance(vl.get("tile_head"), int) and tile_traced_heads(packed):
        n = len(tile_traced_heads(packed))
        label = f"tile-traced: head {vl['tile_head']} of sequence{'s 0–' + str(n - 1) if n > 1 else ' 0'}"
    return fig_varlen.varlen_lanes_figure(a, b, n_sms, unit, f"{prov}. {varlen_lanes_note(packed, padded)}",
                                          traced_heads=heads, traced_label=label)


def varlen_work_figure_for(packed, padded=None, device: str | None = None):
    """Work items per sequence from the traces; without a padded recording, the padded batch's
    items come from the estimator (labelled so); both batches' modelled times always do, on
    `device` ('H100' | 'H200'; default the recording's, the H100 for the interpreter)."""
    from instrumentation.analysis.serving import items_per_sequence, padded_items_model, varlen_items

    from ._common import fmt_time_ms

    device = device or ("H200" if "H200" in str(packed.meta.get("device_name")) else "H100")
    v = varlen_shape(packed)
    n = len(v["lengths"])
    real = items_per_sequence(varlen_items(packed.work, v["lengths"], v["block_m"], v["heads"]), n)
    sh = packed.meta["shape"]
    model = padded_items_model(v["lengths"], sh["H"], sh["H_kv"], sh["D"], packed.meta.get("mask", "causal"),
                               packed.meta["dtype"], v["block_m"], int(packed.meta["block_n"]), device)
    if padded is not None:
        pad = items_per_sequence(varlen_items(padded.work, v["lengths"], int(padded.meta["block_m"]), v["heads"]), n)
        source = f"packed: {packed.provenance()}; padded: {padded.provenance()}"
    else:
        per = pd.Series(model["padded"]["per_seq"])
        pad = pd.DataFrame({"real": real["real"], "padding": per - real["real"]})
        source = f"packed: {packed.provenance()}; padded: analytic model (instrumentation.estimate), not recorded"
    per_seq = pd.DataFrame({"packed_real": real["real"], "padded_real": pad["real"], "padded_padding": pad["padding"]})
    note = (f"modelled on the {device} (instrumentation.estimate): packed {fmt_time_ms(model['packed']['time_s'] * 1e3)}, "
            f"padded {fmt_time_ms(model['padded']['time_s'] * 1e3)}")
    if packed.meta.get("untraced_ms") and padded is not None and padded.meta.get("untraced_ms"):
        note += (f"<br>measured (untraced median of each recording): packed {fmt_time_ms(packed.meta['untraced_ms'])}, "
                 f"padded {fmt_time_ms(padded.meta['untraced_ms'])}")
    return fig_varlen.varlen_work_figure(per_seq, v["lengths"], source, note)
