"""The Backward page's charts drawn from a trace: what the page and `python -m app.export`
(app.figures.registry's BACKWARD_CHARTS) share -- the trace's estimate, its traced heads and dQ
blocks, and each chart from a Trace plus the page's choices (head, query block)."""

from __future__ import annotations

from instrumentation import estimate
from instrumentation.trace.backward_tables import one_pass

from .backward import dq_sources_figure, has_backward, phase_blocks, tile_order_figure
from .backward_time import (backward_flops_figure, backward_lanes_figure, backward_memory_figure,
                            backward_time_figure, backward_timeline)

DEFAULT_SMS = 132
# how a backward kernel orders a dK/dV program's tiles where not top to bottom (meta.backward's
# 'implementation'; the Triton kernel walks its query blocks in increasing order)
DKDV_ORDER = {"gluon": "the Gluon dK·dV pass takes its key block's full tiles first, then the partial ones "
                       "on the mask's edge",
              "gluon one pass": "the one-pass Gluon kernel's key-block programs (they add dQ too) take their full "
                                "tiles first, then the partial ones on the mask's edge"}
NO_BACKWARD = ("this trace has only the forward; the backward charts draw a trace recorded with "
               "record(..., backward=True) or `python -m instrumentation.record_cli --backward`")


def shape_of(trace) -> dict:
    """B, H, H_kv, N_q, N_k, D of a trace's meta as ints."""
    s = trace.meta["shape"]
    return {"B": int(s["B"]), "H": int(s["H"]), "H_kv": int(s.get("H_kv", s["H"])),
            "N_q": int(s.get("N_q", s["N"])), "N_k": int(s.get("N_k", s["N"])), "D": int(s["D"])}


def trace_estimate(trace):
    """instrumentation.estimate at the trace's shape, mask, dtype and forward blocks."""
    s, m = shape_of(trace), trace.meta
    dtype = str(m.get("dtype"))
    return estimate(s["B"], s["H"], s["H_kv"], s["N_q"], s["N_k"], s["D"], trace.mask_spec.text,
                    dtype if dtype in ("bf16", "fp16", "fp32") else "bf16", int(m["block_m"]), int(m["block_n"]))


def traced_heads(trace) -> list[tuple[int, int]]:
    """(batch, query head) pairs with tiles in both the forward's and the dK/dV pass's tables."""
    h = shape_of(trace)["H"]
    bt = trace.bwd_tiles
    kv = {(int(b), int(x)) for b, x in bt[bt["phase"] == "dkdv"][["b", "head"]].itertuples(index=False)}
    return sorted(kv & {divmod(int(bh), h) for bh in trace.tiles["bh"].unique()})


def dq_blocks(trace, b: int, head: int) -> list[int]:
    """The query blocks (dQ pass's blocks) of (b, head) that have dQ tiles."""
    bt = trace.bwd_tiles
    sel = bt[(bt["phase"] == "dq") & (bt["b"] == b) & (bt["head"] == head)]
    return sorted(int(q) for q in sel["q_block"].unique())


def _need(trace) -> None:
    if not has_backward(trace):
        raise ValueError(NO_BACKWARD)


def _head(trace, head):
    heads = traced_heads(trace)
    if not heads:
        raise ValueError("this backward trace keeps no tile detail of a head traced in both passes")
    if head is None:
        return heads[0]
    h = shape_of(trace)["H"]
    want = divmod(int(head), h)                 # --head: the forward's bh = b * H + head
    if want not in heads:
        raise ValueError(f"--head {head} has no backward tile detail; traced: "
                         + ", ".join(str(b * h + x) for b, x in heads[:12]))
    return want


def order_chart(trace, head=None):
    """tile_order_figure of the trace; head: the forward's bh (default the first traced)."""
    _need(trace)
    b, h = _head(trace, head)
    s = shape_of(trace)
    bwd = trace.meta.get("backward")
    note = DKDV_ORDER.get(bwd.get("implementation"), "") if isinstance(bwd, dict) else ""
    return tile_order_figure(trace.tiles, trace.bwd_tiles, phase_blocks(trace.meta), s["N_q"], s["N_k"], b, h,
                             s["H"], trace.provenance(), group=s["H"] // s["H_kv"], order_note=note)


def dq_chart(trace, head=None, q_block=None, q_row=None):
    """dq_sources_figure of the trace for a query block (or the block holding query row q_row);
    default: the middle one with dQ tiles."""
    _need(trace)
    b, h = _head(trace, head)
    blocks, tiles = dq_blocks(trace, b, h), phase_blocks(trace.meta)
    qb = (int(q_row) // tiles["dq"][0] if q_row is not None else blocks[len(blocks) // 2] if q_block is None
          else int(q_block))
    s = shape_of(trace)
    return dq_sources_figure(trace.bwd_tiles, tiles, s["N_q"], s["N_k"], b, h, qb, trace.provenance())


def timeline_of(trace, sms=None):
    """backward_timeline of the trace on its SMs (or `sms` / 132 when modelled), each program
    saying whether it is a tile-traced head's (tile_traced: traced_items.traced_item_mask)."""
    from instrumentation.analysis.traced_items import traced_item_mask

    _need(trace)
    work = trace.bwd_work.assign(tile_traced=traced_item_mask(trace, "bwd_work"))
    tl = backward_timeline(work, sms=int(sms or trace.meta.get("sm_count") or DEFAULT_SMS))
    tl.attrs["one_pass"] = one_pass(trace.meta)
    return tl


def lanes_chart(trace, sms=None):
    """The backward's SM lanes, the tile-traced heads' programs outlined, the caption saying which
    launch drew them (traced_items.launch_note)."""
    from instrumentation.analysis.traced_items import launch_note, tile_traced_heads

    return backward_lanes_figure(timeline_of(trace, sms), trace.provenance(), tile_traced_heads(trace),
                                 launch_note(trace, "bwd_work"))


def time_chart(trace, fwd_tl, sms=None):
    """The time split; fwd_tl: schedule_model.timeline(trace) (measured or modelled like the backward)."""
    m = trace.meta
    untraced = (m.get("untraced_ms"), (m.get("backward") or {}).get("untraced_ms"))
    return backward_time_figure(fwd_tl, timeline_of(trace, sms), trace_estimate(trace), trace.provenance(),
                                untraced_ms=untraced if all(isinstance(x, (int, float)) for x in untraced) else None)


def flops_chart(trace):
    return backward_flops_figure(trace_estimate(trace))


def memory_chart(trace):
    s, e = shape_of(trace), trace_estimate(trace)
    return backward_memory_figure(s["B"], s["H"], s["H_kv"], s["D"], e.dtype, s["N_q"], s["N_k"], e.mask)
