"""The one-pass Gluon backward (kernels.gluon_bwd_onepass_kernel, the product's at D 128) launched
alone on a probe's inputs (benchmarks.gluon_backward.one_kernel_inputs), so the suites can time it
at settings the product does not use (the (Q, dO) ring's depth, consumer registers, D 64) beside
the product's own call. Its forms measured and dropped (P^T through shared memory for dV's
product, three dS buffers, per-group dQ, dQ a tile late) are in docs/performance.md."""

from __future__ import annotations

from kernels.gluon_bwd_launch import dq_accumulator_block, stats_descriptor

from .gluon_backward import one_kernel_inputs, probe_head_groups


def gluon_backward_onepass(do, q, k, v, o, lse, mask="causal", stages=2, consumer_regs=240, head_groups=None,
                           rows=64, dq_by_rows=None):
    """dQ, dK, dV of attention by the one-pass Gluon kernel.

    Arguments:
        do, q, k, v, o, lse: as kernels.backward.flash_attention_backward's: q, o, do (B, H, N_q, D),
            k, v (B, H_kv, N_k, D), contiguous CUDA bf16/fp16, D 64 or 128, N_q a multiple of 4;
            lse (B, H, N_q) float32.
        mask: the forward's; stages: the (Q, dO) ring's depth;
            consumer_regs: setmaxnreg per consumer thread; head_groups: the groups the programs
            take the B * H_kv heads in (kernels.gluon_bwd_kernel.key_block_slot), None: the
            product's (kernels.gluon_bwd_launch.program_head_groups), B * H_kv: head after head;
            rows: query rows per streamed (Q, dO) tile, 64 (the product's) or 128 (FlashAttention-3's
            tile at D 64: half the tiles per key block, twice the work between a tile's barriers);
        dq_by_rows: (128 rows only) each consumer group's dQ product takes half the tile's rows and
            all of D (64-row x D blocks, wgmma N = D: the product's at 128 rows) when True, all the
            rows and half of D when False; None: the product's choice
            (kernels.gluon_bwd_launch.dq_accumulator_block).
    Returns:
        (dq, dk, dv) in the inputs' dtype."""
    from kernels.backward import LOG2E
    from kernels.gluon_bwd_onepass_kernel import attn_bwd_onepass_gluon_kernel

    if rows not in (64, 128) or (rows == 128 and q.shape[-1] != 64):
        raise ValueError(f"rows (query rows per tile) must be 64, or 128 at D 64 (D 128's do not fit in shared "
                         f"memory), not {rows} at D {q.shape[-1]}")
    if dq_by_rows and rows != 128:
        raise ValueError("dq_by_rows splits 128-row tiles between the two consumer groups; give rows=128")
    d = q.shape[-1]
    dq_rows, dq_cols = dq_accumulator_block(rows, d)
    if dq_by_rows is not None:
        dq_rows, dq_cols = (rows // 2, d) if dq_by_rows else (rows, d // 2)
    x = one_kernel_inputs(do, q, k, v, o, lse, mask, stages, "one-pass", rows=rows, dq_rows=dq_rows, dq_cols=dq_cols)
    kp, bp = x.plan.kv_plan, x.plan
    h, h_kv, n_q, n_k = x.q.shape[1], x.k.shape[1], x.q.shape[2], x.k.shape[2]
    heads, groups = x.q.shape[0] * h_kv, probe_head_groups(x, head_groups)
    attn_bwd_onepass_gluon_kernel[(heads * kp.n_kb,)](
        x.q_desc, x.do_desc, x.k_desc, x.v_desc, stats_descriptor(x.stats, rows), x.dk, x.dv, x.dqa_desc, None,
        kp.row_lo, kp.row_hi, bp.kv_full_cnt, bp.kv_full_start, bp.kv_part_cnt, bp.kv_part_idx, bp.kv_order, None, None,
        None, None, h, h // h_kv, n_q, n_k, kp.n_qb, kp.n_kb, groups, x.scale * LOG2E, x.scale, STAGES=stages,
        CONSUMER_REGS=consumer_regs, TRACE_WORK=False, TRACE_TILES=False, num_warps=4)
    return x.dq_acc.to(x.q.dtype), x.dk, x.dv
