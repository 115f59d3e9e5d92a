"""A probe, not a product path: FlashAttention-3's forward schedule written in Triton's Gluon
dialect (Hopper only; neither the interpreter nor the CPU runs it), to measure what the schedule
plain Triton cannot express is worth against kernels.flash_attention on the same GPU.

One program holds 128 query rows of one (batch, head) and runs three partitions:
- a producer warp: Q's two 64-row halves once, then K and V tiles through a STAGES-deep ring in
  shared memory (TMA; a K buffer is refilled once both consumers' scores read it, a V buffer
  once both consumers' P V did);
- two consumer warpgroups, 64 query rows each, with FA3's intra-warpgroup overlap: tile j's
  scores S_j = Q K_j^T are issued before the previous tile's P_{j-1} V_{j-1}, so the softmax of
  S_j runs while the tensor cores do P V; P stays in registers as the A operand of P V.

Bottom-right causal (N_q = N_k here) masks only the diagonal tiles. Inputs: (B, H, N, D) bf16,
contiguous, N a multiple of 128, D 64 / 128 / 256, MHA.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

LOG2E = 1.4426950408889634
ROWS_PER_WG = 64
ROWS = gl.constexpr(ROWS_PER_WG)   # query rows per consumer warpgroup (one wgmma M)


@gluon.jit
def _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
              q_row, kv_row, n_tiles):
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_smem.index(0))
    tma.async_copy_global_to_shared(q_desc, [q_row + ROWS, 0], q_bar, q_smem.index(1))
    for j in range(n_tiles):
        s = j % STAGES
        free = ((j // STAGES) & 1) ^ 1                # the first round passes at once
        mbarrier.wait(k_empty.index(s), free)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv_row + j * BLOCK_N, 0], k_ready.index(s), k_smem.index(s))
        mbarrier.wait(v_empty.index(s), free)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [kv_row + j * BLOCK_N, 0], v_ready.index(s), v_smem.index(s))


@gluon.jit
def _softmax_step(s, m_i, l_i, cols, rows, qk_scale, MASKED: gl.constexpr):
    """Tile scores s (ROWS, BLOCK_N) -> P (bf16), the rescale factor of the running output, and the
    new running max and sum (log2 domain)."""
    if MASKED:
        s = gl.where(cols[None, :] <= rows[:, None], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    p = gl.exp2(s * qk_scale - m_new[:, None])
    alpha = gl.exp2(m_i - m_new)
    return p, alpha, l_i * alpha + gl.sum(p, 1), m_new


@gluon.jit
def _consumer(O, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, q_row, row0, n_tiles,
              n_full, qk_scale, WG: gl.constexpr):
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows = row0 + WG * ROWS + gl.arange(0, ROWS, gl.SliceLayout(1, s_layout))     # (ROWS,) within the head
    col0 = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
    m_i = gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
    zero_s = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    q = q_smem.index(WG)
    mbarrier.wait(q_bar, 0)

    # tile 0: scores and softmax alone
    mbarrier.wait(k_ready.index(0), 0)
    s_tok = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    mbarrier.arrive(k_empty.index(0), count=1)
    if n_full > 0:
        p, alpha, l_i, m_i = _softmax_step(s, m_i, l_i, col0, rows, qk_scale, False)
    else:
        p, alpha, l_i, m_i = _softmax_step(s, m_i, l_i, col0, rows, qk_scale, True)
    p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
    # tile j: issue S_j, then P_{j-1} V_{j-1}; softmax of S_j while P V runs
    for j in range(1, n_tiles):
        s_idx = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_ready.index(s_idx), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q, k_smem.index(s_idx).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        mbarrier.wait(v_ready.index(prev), ((j - 1) // STAGES) & 1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        o_tok = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok,))
        mbarrier.arrive(k_empty.index(s_idx), count=1)
        if j < n_full:
            p, alpha, l_i, m_i = _softmax_step(s, m_i, l_i, col0 + j * BLOCK_N, rows, qk_scale, False)
        else:
            p, alpha, l_i, m_i = _softmax_step(s, m_i, l_i, col0 + j * BLOCK_N, rows, qk_scale, True)
        acc, p_op = warpgroup_mma_wait(0, deps=(o_tok, p_op))
        mbarrier.arrive(v_empty.index(prev), count=1)
        p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
    last = (n_tiles - 1) % STAGES
    mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    o_tok = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
    acc, p_op = warpgroup_mma_wait(0, deps=(o_tok, p_op))
    mbarrier.arrive(v_empty.index(last), count=1)

    # epilogue: O = acc / l, LSE (natural log) per row
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    out = (acc / l_o[:, None]).to(gl.bfloat16)
    o_rows = q_row + WG * ROWS + gl.arange(0, ROWS, gl.SliceLayout(1, o_layout))
    o_cols = gl.arange(0, HEAD_DIM, gl.SliceLayout(0, o_layout))
    gl.store(O + o_rows.to(gl.int64)[:, None] * HEAD_DIM + o_cols[None, :], out)
    gl.store(LSE + q_row + WG * ROWS + gl.arange(0, ROWS, gl.SliceLayout(1, s_layout)),
             (m_i + gl.log2(l_i)) / 1.4426950408889634)


@gluon.jit
def _consumer0(O, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, q_row, row0, n_tiles,
               n_full, qk_scale):
    _consumer(O, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, q_row, row0, n_tiles, n_full,
              qk_scale, 0)


@gluon.jit
def _consumer1(O, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, q_row, row0, n_tiles,
               n_full, qk_scale):
    _consumer(O, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, q_row, row0, n_tiles, n_full,
              qk_scale, 1)


@gluon.jit
def attn_fwd_gluon_kernel(q_desc, k_desc, v_desc, O, LSE, N, qk_scale, CAUSAL: gl.constexpr,
                          BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                          CONSUMER_REGS: gl.constexpr):
    """Grid (N / 128, B * H). q/k/v_desc: (B*H*N, D) views, blocks (64, D) and (BLOCK_N, D);
    O (B*H*N, D), LSE (B*H*N,) float32."""
    m_block = gl.program_id(0)
    bh = gl.program_id(1)
    row0 = m_block * (2 * ROWS)                    # first query row of the program, within the head
    q_row = bh * N + row0
    kv_row = bh * N
    if CAUSAL:
        n_tiles = gl.cdiv(row0 + 2 * ROWS, BLOCK_N)
        n_full = (row0 + 1) // BLOCK_N             # tiles every row of the program sees whole
    else:
        n_tiles = gl.cdiv(N, BLOCK_N)
        n_full = n_tiles
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, ROWS, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)       # both consumers release a K or V buffer
        mbarrier.init(v_empty.index(i), count=2)
    consumer_args = (O, LSE, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty, q_row, row0, n_tiles,
                     n_full, qk_scale)
    gl.warp_specialize([
        (_consumer0, consumer_args),
        (_consumer1, consumer_args),
        (_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, k_ready, v_ready, k_empty, v_empty,
                     q_row, kv_row, n_tiles)),
    ], [4, 1], [CONSUMER_REGS, 24])


def attention_gluon(q, k, v, causal=False, block_n=None, stages=2, consumer_regs=240):
    """O and the natural-log LSE of softmax(Q K^T / sqrt(D)) V by the Gluon FA3-schedule kernel.

    Arguments:
        q, k, v: (B, H, N, D) bf16 CUDA tensors, contiguous, N a multiple of 128, D 64/128/256.
        causal: bottom-right causal mask (N_q = N_k).
        block_n: keys per tile (None: 128, 64 at D 256); stages: K/V ring depth;
        consumer_regs: registers per thread of the second consumer warpgroup (setmaxnreg).
    Returns:
        (o (B, H, N, D) bf16, lse (B, H, N) float32)."""
    b, h, n, d = q.shape
    if k.shape != q.shape or v.shape != q.shape or n % (2 * ROWS_PER_WG) or d not in (64, 128, 256):
        raise ValueError("the Gluon probe takes MHA (B, H, N, D) with N a multiple of 128 and D 64/128/256")
    block_n = block_n or (64 if d == 256 else 128)
    q2, k2, v2 = (t.contiguous().view(b * h * n, d) for t in (q, k, v))
    q_layout = gl.NVMMASharedLayout.get_default_for([ROWS_PER_WG, d], gl.bfloat16)
    kv_layout = gl.NVMMASharedLayout.get_default_for([block_n, d], gl.bfloat16)
    q_desc = TensorDescriptor.from_tensor(q2, [ROWS_PER_WG, d], q_layout)
    k_desc = TensorDescriptor.from_tensor(k2, [block_n, d], kv_layout)
    v_desc = TensorDescriptor.from_tensor(v2, [block_n, d], kv_layout)
    o = torch.empty_like(q2)
    lse = torch.empty(b * h * n, dtype=torch.float32, device=q.device)
    attn_fwd_gluon_kernel[(n // (2 * ROWS_PER_WG), b * h)](
        q_desc, k_desc, v_desc, o, lse, n, d ** -0.5 * LOG2E, CAUSAL=causal, BLOCK_N=block_n, HEAD_DIM=d,
        STAGES=stages, CONSUMER_REGS=consumer_regs, num_warps=4)
    return o.view(b, h, n, d), lse.view(b, h, n)
