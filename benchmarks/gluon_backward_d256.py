"""The D 256 one-pass Gluon backward (kernels.gluon_bwd_d256_kernel) launched alone, untraced and
without the finite-row flag, on one_kernel_inputs' plan and descriptors: what the probes time
against the Triton kernel and cuDNN with a chosen head grouping or register split
(python -m benchmarks.kernel_probe --suite bwdd256)."""

from __future__ import annotations

from kernels.gluon_bwd_d256_kernel import CONSUMER_REGS, DO_STAGES, DQ_COLS, KEYS, PDS_BUFFERS
from kernels.gluon_bwd_launch import stats_descriptor

from .gluon_backward import one_kernel_inputs, probe_head_groups


def gluon_backward_d256(do, q, k, v, o, lse, mask="causal", consumer_regs=CONSUMER_REGS, head_groups=None,
                        do_stages=DO_STAGES, pds_buffers=PDS_BUFFERS, dq_cols=DQ_COLS.value):
    """dQ, dK, dV of attention at head dim 256 by the one-pass Gluon kernel.

    Arguments:
        do, q, k, v, o, lse: as kernels.backward.flash_attention_backward's: q, o, do (B, H, N_q, 256),
            k, v (B, H_kv, N_k, 256), CUDA bf16/fp16, N_q a multiple of 4; lse (B, H, N_q) float32.
        mask: the forward's; consumer_regs: setmaxnreg per consumer thread; head_groups: the groups
            the programs take the B * H_kv heads in (None: kernels.gluon_bwd_launch.program_head_groups);
        do_stages: the dO ring (2 fits with dq_cols 32 only); pds_buffers: P and dS buffers (2 fits
            with one dO stage); dq_cols: dQ columns per reduce-add (a float32 buffer of 64 rows per group).
    Returns:
        (dq, dk, dv) in the inputs' dtype."""
    from kernels.backward import LOG2E
    from kernels.gluon_bwd_d256_kernel import attn_bwd_d256_gluon_kernel     # at call time, as the product's launch

    x = one_kernel_inputs(do, q, k, v, o, lse, mask, 2, "D 256 one-pass", keys=KEYS.value, head_dims=(256,),
                          dq_cols=dq_cols)
    kp, bp = x.plan.kv_plan, x.plan
    h, h_kv, n_q, n_k = x.q.shape[1], x.k.shape[1], x.q.shape[2], x.k.shape[2]
    heads, groups = x.q.shape[0] * h_kv, probe_head_groups(x, head_groups)
    attn_bwd_d256_gluon_kernel[(heads * kp.n_kb,)](
        x.q_desc, x.do_desc, x.k_desc, x.v_desc, stats_descriptor(x.stats), x.dk, x.dv, x.dqa_desc, None,
        kp.row_lo, kp.row_hi, bp.kv_full_cnt, bp.kv_full_start, bp.kv_part_cnt, bp.kv_part_idx, bp.kv_order, None,
        None, None, None, h, h // h_kv, n_q, n_k, kp.n_qb, kp.n_kb, groups, x.scale * LOG2E, x.scale,
        CONSUMER_REGS=consumer_regs, TRACE_WORK=False, TRACE_TILES=False, DO_STAGES=do_stages,
        PDS_BUFFERS=pds_buffers, num_warps=4)
    return x.dq_acc.to(x.q.dtype), x.dk, x.dv
