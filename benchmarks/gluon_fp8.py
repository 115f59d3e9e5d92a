"""A probe, not a product path: the FP8 forward (kernels.fp8_kernel's
numerics, FlashAttention-3's FP8 recipe) with the bf16 Gluon kernel's schedule
(kernels.gluon_fwd_kernel): a producer warp streaming e4m3 K and V^T tiles by TMA, two consumer
warpgroups of 64 query rows issuing tile j's scores before tile j-1's P.V, P quantised to e4m3
and kept in registers as P.V's A operand.

Inputs: kernels.fp8_quant.quantize_fp8's Fp8Inputs at 128-row query tiles and 64- or 128-key
tiles (block_m=128, block_n=64/128): per-tile scales; V stored transposed (HEAD_DIM, keys), the
K-major second operand Hopper's FP8 product takes. Per tile as kernels.fp8_kernel: scores times
(softmax scale * log2(e) * Q's and K's tile scales), P = 2^8 exp2(...) (the row max shifted by 8)
cast to e4m3, V's tile scale folded into the running rescale, the epilogue's one division.
With relabel, P's keys are relabelled within each 16 so that the operand is the scores' registers
renamed (no exchange between threads), on V^T tiles whose columns hold the keys in that order.
P stays fp32 until the iteration that issues its P.V casts it (a loop-carried e4m3 tensor is
carried a byte a register and packed again for the wgmma: 1,411 -> 1,211 instructions a loop at
128 x 128, sm_90 build); full and partial tiles run in two loops. With pingpong, the two consumer
groups take turns to issue their products (FlashAttention-3's inter-warpgroup schedule).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from kernels.gluon_fwd_kernel import block_lists, kv_ring_barriers, list_block, tma_load, wgmma_layout, work_item

ROWS = gl.constexpr(64)
LOG2_P_SCALE = gl.constexpr(8.0)
LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
              q_row, k_row, v_row, n_tiles, n_full, full_start, part_list):
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma_load(q_desc, [q_row, 0], q_bar, q_smem.index(0))
    tma_load(q_desc, [q_row + ROWS, 0], q_bar, q_smem.index(1))
    for t in range(n_tiles):
        s = t % STAGES
        free = ((t // STAGES) & 1) ^ 1
        kb = list_block(t, n_full, full_start, part_list)
        mbarrier.wait(k_empty.index(s), free)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma_load(k_desc, [k_row + kb * BLOCK_N, 0], k_ready.index(s), k_smem.index(s))
        mbarrier.wait(v_empty.index(s), free)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        tma_load(v_desc, [v_row, kb * BLOCK_N], v_ready.index(s), v_smem.index(s))


@gluon.jit
def _softmax_step(s, m_i, l_i, cols, lo, hi, scale, MASKED: gl.constexpr):
    """kernels.tile_ops.softmax_update's FP8 step on raw e4m3 scores: P = 2^8 * exp2(S scale - m)."""
    if MASKED:
        s = gl.where((cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None]), s * scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s - (m_ref - LOG2_P_SCALE)[:, None])
    else:
        m_new = gl.maximum(m_i, gl.max(s, 1) * scale)
        m_ref = m_new
        p = gl.exp2(s * scale - (m_ref - LOG2_P_SCALE)[:, None])
    alpha = gl.exp2(m_i - m_ref)
    return p, alpha, l_i * alpha + gl.sum(p, 1), m_new


@gluon.jit
def _relabel_keys(p):
    """P (ROWS, BLOCK_N) in the scores' accumulator layout, its keys relabelled within each 16 so
    that P.V's register operand needs no exchange between threads. Within 16 keys, a thread of the
    accumulator holds key bits 1 and 2 by lane and bit 3 by register; one of the e4m3 A operand
    holds bits 2 and 3 by lane and bit 1 by register. Column j = j0 + 2 j1 + 4 j2 + 8 j3 of the
    result is key j0 + 2 j2 + 4 j3 + 8 j1 of the input (key_order(): V^T's columns then hold the
    keys in that order)."""
    R: gl.constexpr = p.shape[0]
    G: gl.constexpr = p.shape[1] // 16
    p = gl.reshape(p, [R, G, 2, 2, 2, 2])               # (row, group, c3, c2, c1, c0): key bits
    p = gl.permute(p, (0, 1, 3, 4, 2, 5))              # (row, group, c2, c1, c3, c0) = (j3, j2, j1, j0)
    return gl.reshape(p, [R, G * 16])


def key_order(block_n: int) -> torch.Tensor:
    """The keys of a block_n-key tile in _relabel_keys' order: V^T's column j holds this key."""
    j = torch.arange(block_n)
    low = j % 16
    return j - low + (low & 1) + 2 * ((low >> 2) & 1) + 4 * ((low >> 3) & 1) + 8 * ((low >> 1) & 1)


@gluon.jit
def _p_operand(p, p_layout: gl.constexpr, RELABEL: gl.constexpr):
    """P as P.V's e4m3 register operand (RELABEL: its keys in key_order(), V^T stored so)."""
    p8 = p.to(gl.float8e4nv)
    if RELABEL:         # (a layout of its own until converted: one convert per branch)
        op = gl.convert_layout(_relabel_keys(p8), p_layout)
    else:
        op = gl.convert_layout(p8, p_layout)
    return op


@gluon.jit
def _take_turn(turn, WG: gl.constexpr, k, PINGPONG):
    """FlashAttention-3's ping-pong between the two consumer warpgroups: a group issues its k-th
    batch of products only after the other group issued its own, so that one group's softmax runs
    while the other's products occupy the tensor cores (turn[WG] completes a phase per hand-over)."""
    if PINGPONG:
        mbarrier.wait(turn.index(WG), k & 1)


@gluon.jit
def _pass_turn(turn, WG: gl.constexpr, PINGPONG):
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - WG), count=1)


@gluon.jit
def _tile(t, q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn, acc, p, factor, s_v, l_i, m_i, n_full,
          full_start, part_list, k_scale, v_scale, tile_scale, col0, lo, hi, zero_s, RELABEL: gl.constexpr,
          PINGPONG: gl.constexpr, WG: gl.constexpr, MASKED: gl.constexpr):
    """Tile t: issue S_t = Q K_t^T, then P_{t-1} V_{t-1} (its P cast to e4m3 here), the softmax of
    S_t while P V runs. Returns the carried state (acc, p, factor, s_v, l_i, m_i)."""
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    o_layout: gl.constexpr = acc.type.layout
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    cur = t % STAGES
    prev = (t - 1) % STAGES
    acc = acc * gl.convert_layout(factor, gl.SliceLayout(1, o_layout))[:, None]
    p_op = _p_operand(p, p_layout, RELABEL)
    _take_turn(turn, WG, t, PINGPONG)
    mbarrier.wait(k_ready.index(cur), (t // STAGES) & 1)
    s_tok = warpgroup_mma(q, k_smem.index(cur).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    mbarrier.wait(v_ready.index(prev), ((t - 1) // STAGES) & 1)
    o_tok = warpgroup_mma(p_op, v_smem.index(prev).permute((1, 0)), acc, is_async=True)
    _pass_turn(turn, WG, PINGPONG)
    s = warpgroup_mma_wait(1, deps=(s_tok,))
    mbarrier.arrive(k_empty.index(cur), count=1)
    kb = list_block(t, n_full, full_start, part_list)
    p, alpha, l_i, m_i = _softmax_step(s, m_i, l_i, col0 + kb * BLOCK_N, lo, hi, tile_scale * gl.load(k_scale + kb),
                                       MASKED)
    s_new = gl.load(v_scale + kb)
    factor = alpha * (s_v / s_new)
    acc = warpgroup_mma_wait(0, deps=(o_tok,))      # (an e4m3 operand cannot be a dep on Triton 3.6)
    mbarrier.arrive(v_empty.index(prev), count=1)
    return acc, p, factor, s_new, l_i, m_i


@gluon.jit
def _consumer(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty,
              v_empty, row_lo, row_hi, o_row, row0, n_tiles, n_full, full_start, part_list, N_Q, qk_scale,
              turn, RELABEL: gl.constexpr, PINGPONG: gl.constexpr, WG: gl.constexpr):
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    s_layout: gl.constexpr = wgmma_layout(BLOCK_N, 32)
    o_layout: gl.constexpr = wgmma_layout(HEAD_DIM, 32)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    row_vec: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_vec: gl.constexpr = gl.SliceLayout(1, o_layout)
    rows = row0 + WG * ROWS + gl.arange(0, ROWS, row_vec)
    lo = gl.load(row_lo + rows, mask=rows < N_Q, other=0)
    hi = gl.load(row_hi + rows, mask=rows < N_Q, other=-1)
    col0 = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
    m_i = gl.full([ROWS], float("-inf"), gl.float32, row_vec)
    l_i = gl.zeros([ROWS], gl.float32, row_vec)
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
    zero_s = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    tile_scale = qk_scale * q_scale                     # softmax scale * log2(e) * Q's tile scale
    s_v = 1.0
    q = q_smem.index(WG)
    mbarrier.wait(q_bar, 0)
    if n_tiles > 0:
        _take_turn(turn, WG, 0, PINGPONG)
        mbarrier.wait(k_ready.index(0), 0)
        s_tok = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        _pass_turn(turn, WG, PINGPONG)
        s = warpgroup_mma_wait(0, deps=(s_tok,))
        mbarrier.arrive(k_empty.index(0), count=1)
        kb = list_block(0, n_full, full_start, part_list)
        scale = tile_scale * gl.load(k_scale + kb)
        if n_full > 0:
            p, alpha, l_i, m_i = _softmax_step(s, m_i, l_i, col0 + kb * BLOCK_N, lo, hi, scale, False)
        else:
            p, alpha, l_i, m_i = _softmax_step(s, m_i, l_i, col0 + kb * BLOCK_N, lo, hi, scale, True)
        s_new = gl.load(v_scale + kb)
        factor = alpha * (s_v / s_new)                  # acc in units of the newest V tile's scale
        s_v = s_new
        # full tiles, then partial ones: two loops, so that neither carries the other's code
        for t in range(1, n_full):      # P stays fp32 until the iteration that issues its P.V casts it
            acc, p, factor, s_v, l_i, m_i = _tile(t, q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn, acc, p,
                                                  factor, s_v, l_i, m_i, n_full, full_start, part_list, k_scale,
                                                  v_scale, tile_scale, col0, lo, hi, zero_s, RELABEL, PINGPONG, WG,
                                                  False)
        for t in range(gl.maximum(n_full, 1), n_tiles):
            acc, p, factor, s_v, l_i, m_i = _tile(t, q, k_smem, v_smem, k_ready, v_ready, k_empty, v_empty, turn, acc, p,
                                                  factor, s_v, l_i, m_i, n_full, full_start, part_list, k_scale,
                                                  v_scale, tile_scale, col0, lo, hi, zero_s, RELABEL, PINGPONG, WG,
                                                  True)
        last = (n_tiles - 1) % STAGES
        acc = acc * gl.convert_layout(factor, o_vec)[:, None]
        p_op = _p_operand(p, p_layout, RELABEL)
        _take_turn(turn, WG, n_tiles, PINGPONG)
        mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
        o_tok = warpgroup_mma(p_op, v_smem.index(last).permute((1, 0)), acc, is_async=True)
        _pass_turn(turn, WG, PINGPONG)
        acc = warpgroup_mma_wait(0, deps=(o_tok,))      # (an e4m3 operand cannot be a dep on Triton 3.6)
        mbarrier.arrive(v_empty.index(last), count=1)
    # epilogue: O = acc * s_v / l (both in P_SCALE units), LSE = (m + log2(l / 2^8)) ln 2
    seen = l_i > 0.0
    l_safe = gl.where(seen, l_i, 1.0)
    out = acc * gl.convert_layout(s_v / l_safe, o_vec)[:, None]
    o_rows = row0 + WG * ROWS + gl.arange(0, ROWS, o_vec)
    o_cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, o_layout))
    gl.store(O + (o_row - row0 + o_rows).to(gl.int64)[:, None] * HEAD_DIM + o_cols[None, :],
             out.to(O.dtype.element_ty), mask=(o_rows < N_Q)[:, None])
    lse = gl.where(seen, (m_i + gl.log2(l_safe) - LOG2_P_SCALE) * LN2, float("-inf"))
    gl.store(LSE + (o_row - row0) + rows, lse, mask=rows < N_Q)


@gluon.jit
def _consumer0(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
               row_lo, row_hi, o_row, row0, n_tiles, n_full, full_start, part_list, N_Q, qk_scale,
               turn, RELABEL: gl.constexpr, PINGPONG: gl.constexpr):
    _consumer(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
              row_lo, row_hi, o_row, row0, n_tiles, n_full, full_start, part_list, N_Q, qk_scale, turn, RELABEL,
              PINGPONG, 0)


@gluon.jit
def _consumer1(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
               row_lo, row_hi, o_row, row0, n_tiles, n_full, full_start, part_list, N_Q, qk_scale,
               turn, RELABEL: gl.constexpr, PINGPONG: gl.constexpr):
    _consumer(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
              row_lo, row_hi, o_row, row0, n_tiles, n_full, full_start, part_list, N_Q, qk_scale, turn, RELABEL,
              PINGPONG, 1)


@gluon.jit(do_not_specialize=["H", "GROUP", "N_Q", "n_qb", "n_kb"])
def attn_fwd_fp8_gluon_kernel(q_desc, k_desc, v_desc, O, LSE, q_scale, k_scale, v_scale, row_lo, row_hi, full_cnt,
                              full_start, part_cnt, part_idx, H, GROUP, N_Q, n_qb, n_kb, qk_scale,
                              STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, RELABEL: gl.constexpr,
                              PINGPONG: gl.constexpr):
    """Grid (B*H*n_qb,), program = bh * n_qb + query block. q_desc: Q8 (B*H*n_qb*128, D) in (64, D)
    blocks; k_desc: K8 (B*H_kv*n_kb*BLOCK_N, D) in (BLOCK_N, D); v_desc: V8^T (B*H_kv*D, n_kb*BLOCK_N)
    in (D, BLOCK_N); O (B*H*N_q, D); LSE (B*H*N_q,); scales per tile; the plan's lists."""
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = k_desc.block_type.shape[1]
    work = gl.program_id(0)
    bh, q_block, kv_bh, row0 = work_item(work, H, GROUP, n_qb)
    n_full, first_full, n_tiles, part_list = block_lists(q_block, full_cnt, full_start, part_cnt, part_idx, n_kb)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, ROWS, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, HEAD_DIM, BLOCK_N], v_desc.layout)
    q_bar, k_ready, v_ready, k_empty, v_empty = kv_ring_barriers(STAGES)
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    mbarrier.arrive(turn.index(0), count=1)           # group 0 issues first
    consumer_args = (O, LSE, gl.load(q_scale + work), k_scale + kv_bh * n_kb, v_scale + kv_bh * n_kb, q_smem, k_smem,
                     v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, row_lo, row_hi, bh * N_Q + row0, row0,
                     n_tiles, n_full, first_full, part_list, N_Q, qk_scale, turn, RELABEL, PINGPONG)
    gl.warp_specialize([
        (_consumer0, consumer_args),
        (_consumer1, consumer_args),
        (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
                     work * (2 * ROWS), kv_bh * n_kb * BLOCK_N, kv_bh * HEAD_DIM, n_tiles, n_full, first_full,
                     part_list)),
    ], [4, 1], [CONSUMER_REGS, 24])


def keys_relabelled(x):
    """x (Fp8Inputs) with each V^T tile's columns in key_order(): the inputs of attention_fp8_gluon(...,
    relabel=True)."""
    import dataclasses

    order = key_order(x.block_n).to(x.v.device)
    v = x.v.view(*x.v.shape[:-1], -1, x.block_n)[..., order].reshape(x.v.shape)
    return dataclasses.replace(x, v=v)


def attention_fp8_gluon(x, mask="causal", stages=2, consumer_regs=240, relabel=False, pingpong=False):
    """O and the natural-log LSE of the FP8 attention of quantised inputs by the Gluon probe.

    Arguments:
        x: quantize_fp8(q, k, v, block_m=128, block_n=64 or 128, ...)'s Fp8Inputs (padded D 64/128/256).
        mask: as kernels.fp8.attention_fp8's; stages: K/V ring depth; consumer_regs: setmaxnreg;
            relabel: P.V's operand in _relabel_keys' key order; x.v must hold each tile's keys in
            key_order() (keys_relabelled(x) makes such inputs; a quantise pass could store V^T so);
            pingpong: the two consumer groups issue their products in turn (_take_turn).
    Returns:
        (o (B, H, N_q, D) in x.dtype, lse (B, H, N_q) float32)."""
    from kernels.fp8 import LOG2E
    from kernels.masks import parse_mask
    from kernels.plan import block_plan
    from kernels.shapes import softmax_scale
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    b, h, n_q, d = x.shape
    hd = x.q.shape[-1]
    if x.block_m != 128 or x.block_n not in (64, 128) or hd not in (64, 128, 256):
        raise ValueError(f"the Gluon FP8 probe takes 128 x 64/128 tiles at D 64/128/256, not "
                         f"{x.block_m} x {x.block_n} at {hd}")
    plan = block_plan(parse_mask(mask, n_q, x.n_k), n_q, 128, x.block_n, x.q.device, x.n_k)
    e4m3 = gl.float8e4nv
    q_desc = TensorDescriptor.from_tensor(x.q.view(-1, hd), [64, hd], gl.NVMMASharedLayout.get_default_for([64, hd], e4m3))
    k_desc = TensorDescriptor.from_tensor(x.k.view(-1, hd), [x.block_n, hd],
                                          gl.NVMMASharedLayout.get_default_for([x.block_n, hd], e4m3))
    v_desc = TensorDescriptor.from_tensor(x.v.view(-1, x.v.shape[-1]), [hd, x.block_n],
                                          gl.NVMMASharedLayout.get_default_for([hd, x.block_n], e4m3))
    o = torch.empty((b * h * n_q, hd), dtype=x.dtype, device=x.q.device)
    lse = torch.empty(b * h * n_q, dtype=torch.float32, device=x.q.device)
    attn_fwd_fp8_gluon_kernel[(b * h * plan.n_qb,)](
        q_desc, k_desc, v_desc, o, lse, x.q_scale, x.k_scale, x.v_scale, plan.row_lo, plan.row_hi, plan.full_cnt,
        plan.full_start, plan.part_cnt, plan.part_idx, h, h // x.h_kv, n_q, plan.n_qb, plan.n_kb,
        softmax_scale(None, d) * LOG2E, STAGES=stages, CONSUMER_REGS=consumer_regs, RELABEL=relabel, PINGPONG=pingpong,
        num_warps=4)
    return o.view(b, h, n_q, hd)[..., :d], lse.view(b, h, n_q)
