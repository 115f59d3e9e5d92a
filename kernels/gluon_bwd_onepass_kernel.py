"""The Hopper backward in one Gluon kernel, FlashAttention-3's order of products (measured against
the two Gluon passes and cuDNN: benchmarks.kernel_probe --suite bwdonepass, docs/performance.md).
kernels.gluon_bwd_launch launches it after kernels.backward_kernel's preprocess (the statistics
STATS: (B*H, 2, N_q) float32, lse * log2(e) with +inf where a row sees no key, then delta) into a
zeroed float32 dQ accumulator, which the launch then rounds into dQ.

One program per (b * H_kv + kv head, key block of 128 keys), three partitions: the dK/dV pass's
producer warp (kernels.gluon_bwd_kernel: K and V once, then each tile's Q, dO, lse and delta by
TMA) and two consumer warpgroups of 64 keys. Per tile (64 query rows of one query head of the
group, 128 at D 64: the descriptors' block) and warpgroup:
- S^T = K Q^T and dP^T = V dO^T are issued together, dV += P^T dO as soon as P^T is known;
- dS^T goes to shared memory (dK's and dQ's products read it there), then dQ's product and
  dK += dS^T Q are issued back to back: dQ[:, this group's half of D] = dS K[:, half] over the
  tile's 128 keys (both groups' dS, so each waits for the other's); where the dQ accumulator's
  block has half a tile's rows (D 64's 128-row tiles: kernels.gluon_bwd_launch.dq_accumulator_block),
  dQ[this group's half of the rows, :] instead;
- the group waits for dV and dQ only (dK runs on), writes dQ (times the softmax scale) into its
  own float32 buffer and adds the buffer into the accumulator by one TMA bulk reduce-add that
  nobody waits for until the buffer is written again, a tile later.
dQ's product reads K from the K tiles the groups hold. The reduce-adds reach a row of dQ in the
order the programs run, so dQ is not bit-reproducible run to run (the two passes are:
kernels.gluon_bwd_launch runs them for deterministic calls, BackwardConfig.deterministic or
torch.use_deterministic_algorithms).

S^T's product starts from -lse / scale and dP^T's from -delta (no row statistics held in registers
under the products); in partial tiles the pairs outside each query row's key interval, and rows
past N_q, start from -inf and rows past N_q take delta = 0 (P = dS = 0: their dQ parts add zeros).
FLAG (the preprocess's marked-row flag, or None): when set, every program runs no tile, stores zero
dK, dV and adds nothing; the Triton kernel's finite-row run (launched after) writes the gradients.
Traced variants write kernels.backward_launch's BackwardTraceBuffers: each program's SM and
globaltimer span (TRACE_WORK), the traced heads' visit order (warpgroup 0) and the row sums of the
recomputed P, each group's sums over its 64 keys added into the zeroed rows by float32 atomics
(TRACE_TILES). D 128, and D 64 in 128-row tiles (in 64-row ones slower than the Triton kernel),
bf16 / fp16.
"""

from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)

from .gluon_bwd_kernel import (KEYS, _dkdv_producer, key_block_item, key_block_slot, key_visible, record_program,
                               store_dkdv)
from .gluon_fwd_kernel import _globaltimer, list_block, wgmma_layout

DS_BUFFERS = gl.constexpr(2)   # the dS ring: a group writes tile i's dS once both groups' dQ products of i - 2 are done


@builtin
def tma_reduce_add_shared(tensor_desc, coord, src, _semantic=None):
    """src (shared memory, the descriptor's block and layout) added into the descriptor's block at
    coord by one TMA bulk reduce-add, committed as a bulk group and not waited for
    (`tma.store_wait` waits until the copy has read src). Triton 3.6's Gluon builder has the op
    but no Python name for it."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _dq_product(ds_buf, k_lo, k_hi):
    """dS K[:, cols] over the tile's 128 keys (both groups' dS^T in ds_buf: all the tile's rows,
    or a group's half of them), issued as two products of 64 keys, K[:, cols] read from the K tiles
    the groups hold (no second copy of K)."""
    BLOCK_M: gl.constexpr = ds_buf.shape[1]
    HALF: gl.constexpr = k_lo.shape[1]
    tok = warpgroup_mma(ds_buf.slice(0, KEYS).permute((1, 0)), k_lo,
                        gl.zeros([BLOCK_M, HALF], gl.float32, wgmma_layout(HALF)), use_acc=False, is_async=True)
    return warpgroup_mma(ds_buf.slice(KEYS, KEYS).permute((1, 0)), k_hi, tok, is_async=True)


@gluon.jit
def _add_dq(row, col, dq, dq_buf, dqa_desc, sm_scale):
    """A dQ part (registers) added to the accumulator's block at (row, col) through this group's
    buffer. Rows past N_q hold zeros (dS is 0 there): added into the next head's rows."""
    tma.store_wait(0)                       # the last tile's reduce-add has read the buffer
    dq_buf.store(dq * sm_scale)
    fence_async_shared()
    tma_reduce_add_shared(dqa_desc, [row, col], dq_buf)


@gluon.jit
def _consumer(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, kv_bar, ready,
              empty, ds_ready, ds_free, lse_smem, delta_smem, head0, key0, kb, n_tiles, n_items, n_full, full_start,
              part_list, N_Q, N_K, qk_scale, sm_scale, dkv_row, tr_tiles, tr_rows, head_slot, n_qb, n_kb,
              WG: gl.constexpr, TRACED: gl.constexpr):
    """A warpgroup's 64 keys against every item's (Q, dO) tile, its dQ parts added as they come,
    then its dK (times the softmax scale) and dV rows. TRACED: a traced head's visit numbers
    (warpgroup 0) and its rows' sums of the recomputed P over this group's keys."""
    STAGES: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    HEAD_DIM: gl.constexpr = q_smem.shape[2]
    HALF: gl.constexpr = HEAD_DIM // 2
    NB: gl.constexpr = ds_smem.shape[0]
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M)
    kv_layout: gl.constexpr = wgmma_layout(HEAD_DIM)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_vec: gl.constexpr = gl.SliceLayout(0, s_layout)
    keys = key0 + WG * KEYS + gl.arange(0, KEYS, gl.SliceLayout(1, s_layout))     # (KEYS,) this group's keys
    cols = gl.arange(0, BLOCK_M, col_vec)
    zero_s = gl.zeros([KEYS, BLOCK_M], gl.float32, s_layout)
    inv_qk_scale = 1.0 / qk_scale
    dk = gl.zeros([KEYS, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([KEYS, HEAD_DIM], gl.float32, kv_layout)
    # dQ's block (the accumulator descriptor's): all the tile's rows and this group's half of D, or
    # (DQ_BY_ROWS, 128-row tiles) this group's half of the rows and all of D (N = D, not D / 2)
    DQ_ROWS: gl.constexpr = dq_smem.shape[1]
    DQ_BY_ROWS: gl.constexpr = DQ_ROWS < BLOCK_M
    k = k_smem.index(WG)
    v = v_smem.index(WG)
    if DQ_BY_ROWS:
        k_lo = k_smem.index(0)                                 # K, keys 0-63
        k_hi = k_smem.index(1)                                 # keys 64-127
    else:
        k_lo = k_smem.index(0).slice(WG * HALF, HALF, dim=1)  # K[:, this group's half of D], keys 0-63
        k_hi = k_smem.index(1).slice(WG * HALF, HALF, dim=1)  # keys 64-127
    dq_buf = dq_smem.index(WG)
    mbarrier.wait(kv_bar, 0)
    for it in range(n_items):
        s = it % STAGES
        t = it % n_tiles
        q_block = list_block(t, n_full, full_start, part_list)
        rows = q_block * BLOCK_M + cols                                     # (BLOCK_M,) query rows
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        # S^T starts from -lse / scale and dP^T from -delta, so no row statistics stay in registers
        # under the products; a partial tile's hidden pairs (each query row's key interval; rows
        # past N_q see nothing) start from -inf, so P is 0 there without a mask after the product
        s_init = zero_s - (lse_smem.index(s).load(col_vec) * inv_qk_scale)[None, :]
        if t >= n_full:
            s_init = gl.where(key_visible(keys, rows, rows < N_Q, row_lo, row_hi), s_init, float("-inf"))
        q = q_smem.index(s)
        do = do_smem.index(s)
        s_tok = warpgroup_mma(k, q.permute((1, 0)), s_init, is_async=True)                   # S^T - lse / scale
        delta = delta_smem.index(s).load(col_vec)
        if t >= n_full:     # rows past N_q read the next head's statistics (lse may be +inf): P is 0 there
            delta = gl.where(rows < N_Q, delta, 0.0)
        dp_tok = warpgroup_mma(v, do.permute((1, 0)), zero_s - delta[None, :], is_async=True)   # dP^T - D
        st = warpgroup_mma_wait(1, deps=(s_tok,))
        p = gl.exp2(st * qk_scale)                                           # P^T (KEYS, BLOCK_M)
        if TRACED:          # a traced head's rows' sums over this group's keys: P through shared memory into
            # a layout with each row's keys in one thread (the fastest of three ways measured, against an
            # atomic per value and a sum across the warps: docs/performance.md)
            hslot = gl.load(head_slot + head0 + it // n_tiles).to(gl.int64)
            if hslot >= 0:
                if BLOCK_M > KEYS:      # 128 rows: that layout's scratch (64 KiB) does not fit beside the tiles
                    gl.atomic_add(tr_rows + hslot * N_Q + rows, gl.sum(p, 0), mask=rows < N_Q)
                else:
                    by_row: gl.constexpr = gl.BlockedLayout([KEYS, 1], [1, 32], [1, 4], [0, 1])
                    sums = gl.sum(gl.convert_layout(p, by_row), 0)
                    r = gl.convert_layout(rows, gl.SliceLayout(0, by_row))
                    gl.atomic_add(tr_rows + hslot * N_Q + r, sums, mask=r < N_Q)
        p_op = gl.convert_layout(p.to(q_smem.dtype), a_layout)
        dv_tok = warpgroup_mma(p_op, do, dv, is_async=True)                  # dV += P^T dO
        dpt = warpgroup_mma_wait(1, deps=(dp_tok,))
        ds = (p * dpt).to(q_smem.dtype)                                     # dS^T = P^T (dP^T - D)
        # this group's dS^T into the tile's (128 keys, BLOCK_M) buffer once both groups' dQ products
        # of item it - NB have read it, then dQ's product and dK's, back to back
        ds_mine = ds_smem.index(it % NB).slice(WG * KEYS, KEYS)
        row = (head0 + it // n_tiles) * N_Q + q_block * BLOCK_M             # the tile's first row in dQ
        mbarrier.wait(ds_free.index(it % NB), ((it // NB) & 1) ^ 1)
        ds_mine.store(ds)
        fence_async_shared()
        mbarrier.arrive(ds_ready.index(it % NB), count=1)
        mbarrier.wait(ds_ready.index(it % NB), (it // NB) & 1)
        if DQ_BY_ROWS:      # dQ[this group's rows, :]
            dq_tok = _dq_product(ds_smem.index(it % NB).slice(WG * DQ_ROWS, DQ_ROWS, dim=1), k_lo, k_hi)
        else:               # dQ[:, this group's half of D]
            dq_tok = _dq_product(ds_smem.index(it % NB), k_lo, k_hi)
        dk_tok = warpgroup_mma(ds_mine, q, dk, is_async=True)                # dK += dS^T Q
        dq = warpgroup_mma_wait(1, deps=(dq_tok,))                           # dV and dQ done, dK runs on
        mbarrier.arrive(ds_free.index(it % NB), count=1)
        if DQ_BY_ROWS:
            _add_dq(row + WG * DQ_ROWS, 0, dq, dq_buf, dqa_desc, sm_scale)
        else:
            _add_dq(row, WG * HALF, dq, dq_buf, dqa_desc, sm_scale)
        dv, dk, p_op = warpgroup_mma_wait(0, deps=(dv_tok, dk_tok, p_op))
        mbarrier.arrive(empty.index(s), count=1)                             # Q, dO read
        if TRACED:
            if WG == 0:
                if hslot >= 0:
                    gl.store(tr_tiles + (hslot * n_qb + q_block) * n_kb + kb, it)
    tma.store_wait(0)
    store_dkdv(DK, DV, dk, dv, key0 + WG * KEYS, dkv_row + WG * KEYS, N_K, sm_scale)


# a partition's constexprs are fixed in a wrapper (warp_specialize passes values only, and no None)
@gluon.jit
def _consumer0(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, kv_bar, ready,
               empty, ds_ready, ds_free, lse_smem, delta_smem, head0, key0, kb, n_tiles, n_items, n_full, full_start,
               part_list, N_Q, N_K, qk_scale, sm_scale, dkv_row):
    _consumer(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, kv_bar, ready,
              empty, ds_ready, ds_free, lse_smem, delta_smem, head0, key0, kb, n_tiles, n_items, n_full, full_start,
              part_list, N_Q, N_K, qk_scale, sm_scale, dkv_row, 0, 0, 0, 0, 0, 0, False)


@gluon.jit
def _consumer1(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, kv_bar, ready,
               empty, ds_ready, ds_free, lse_smem, delta_smem, head0, key0, kb, n_tiles, n_items, n_full, full_start,
               part_list, N_Q, N_K, qk_scale, sm_scale, dkv_row):
    _consumer(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, kv_bar, ready,
              empty, ds_ready, ds_free, lse_smem, delta_smem, head0, key0, kb, n_tiles, n_items, n_full, full_start,
              part_list, N_Q, N_K, qk_scale, sm_scale, dkv_row, 0, 0, 0, 0, 0, 1, False)


@gluon.jit
def _consumer0_traced(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, kv_bar,
                      ready, empty, ds_ready, ds_free, lse_smem, delta_smem, head0, key0, kb, n_tiles, n_items, n_full,
                      full_start, part_list, N_Q, N_K, qk_scale, sm_scale, dkv_row, tr_tiles, tr_rows, head_slot,
                      n_qb, n_kb):
    _consumer(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, kv_bar, ready,
              empty, ds_ready, ds_free, lse_smem, delta_smem, head0, key0, kb, n_tiles, n_items, n_full, full_start,
              part_list, N_Q, N_K, qk_scale, sm_scale, dkv_row, tr_tiles, tr_rows, head_slot, n_qb, n_kb, 0, True)


@gluon.jit
def _consumer1_traced(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, kv_bar,
                      ready, empty, ds_ready, ds_free, lse_smem, delta_smem, head0, key0, kb, n_tiles, n_items, n_full,
                      full_start, part_list, N_Q, N_K, qk_scale, sm_scale, dkv_row, tr_tiles, tr_rows, head_slot,
                      n_qb, n_kb):
    _consumer(DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, kv_bar, ready,
              empty, ds_ready, ds_free, lse_smem, delta_smem, head0, key0, kb, n_tiles, n_items, n_full, full_start,
              part_list, N_Q, N_K, qk_scale, sm_scale, dkv_row, tr_tiles, tr_rows, head_slot, n_qb, n_kb, 1, True)


@gluon.jit(do_not_specialize=["H", "GROUP", "N_Q", "N_K", "n_qb", "n_kb", "head_groups"])
def attn_bwd_onepass_gluon_kernel(q_desc, do_desc, k_desc, v_desc, st_desc, DK, DV, dqa_desc, FLAG, row_lo, row_hi,
                                  full_cnt, full_start, part_cnt, part_idx, kv_order, tr_work, tr_tiles, tr_rows,
                                  head_slot, H, GROUP, N_Q, N_K, n_qb, n_kb, head_groups, qk_scale, sm_scale,
                                  STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, TRACE_WORK: gl.constexpr,
                                  TRACE_TILES: gl.constexpr):
    """One program per (b * H_kv + kv head, key block kv_order[...]), in key_block_slot's order
    (head_groups groups of heads). Descriptors and lists as kernels.gluon_bwd_kernel's dK/dV
    kernel's; dqa_desc: the zeroed (B*H*N_q, D) float32 dQ
    accumulator in (64, D / 2) blocks (dQ times the softmax scale is added); FLAG: the marked-row
    flag or None; tr_work, tr_tiles, tr_rows, head_slot: the trace buffers (None untraced; tr_rows
    zeroed)."""
    if TRACE_WORK:
        t_start = _globaltimer()
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
    kb, head0, key0, kv_row, n_full, first_full, n_tiles, part_list = key_block_item(
        kv_order, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_K, n_qb, n_kb, head_groups)
    n_items = n_tiles * GROUP
    if FLAG is not None:    # a marked row: the finite-row run does the work
        n_items = n_items * (gl.load(FLAG) == 0).to(gl.int32)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([2 * KEYS, BLOCK_M], q_desc.dtype)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [2, KEYS, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [2, KEYS, HEAD_DIM], v_desc.layout)
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [DS_BUFFERS, 2 * KEYS, BLOCK_M], ds_layout)
    dq_smem = gl.allocate_shared_memory(gl.float32, [2] + dqa_desc.block_type.shape, dqa_desc.layout)  # per group
    lse_smem = gl.allocate_shared_memory(st_desc.dtype, [STAGES, BLOCK_M], st_desc.layout)
    delta_smem = gl.allocate_shared_memory(st_desc.dtype, [STAGES, BLOCK_M], st_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [DS_BUFFERS, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [DS_BUFFERS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)          # both consumers release a (Q, dO) stage
    for i in gl.static_range(DS_BUFFERS):
        mbarrier.init(ds_ready.index(i), count=2)       # both groups' dS^T written
        mbarrier.init(ds_free.index(i), count=2)        # both groups' dQ products done with it
    consumer_args = (DK, DV, dqa_desc, row_lo, row_hi, q_smem, do_smem, k_smem, v_smem, ds_smem, dq_smem, kv_bar,
                     ready, empty, ds_ready, ds_free, lse_smem, delta_smem, head0, key0, kb, n_tiles, n_items, n_full,
                     first_full, part_list, N_Q, N_K, qk_scale, sm_scale, kv_row)
    producer_args = (q_desc, do_desc, k_desc, v_desc, st_desc, q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem,
                     kv_bar, ready, empty, kv_row, head0, n_tiles, n_items, n_full, first_full, part_list, N_Q)
    if TRACE_TILES:
        traced_args = consumer_args + (tr_tiles, tr_rows, head_slot, n_qb, n_kb)
        gl.warp_specialize([(_consumer0_traced, traced_args), (_consumer1_traced, traced_args),
                            (_dkdv_producer, producer_args)], [4, 1], [CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([(_consumer0, consumer_args), (_consumer1, consumer_args),
                            (_dkdv_producer, producer_args)], [4, 1], [CONSUMER_REGS, 24])
    if TRACE_WORK:
        record_program(tr_work, t_start, key_block_slot(n_kb, head_groups))
