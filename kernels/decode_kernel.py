"""The instrumented split-KV decoding kernels (FlashDecoding, Triton).

Stage 1 (`decode_split_kernel`): one program per (split, batch * kv_head, row block). The query
rows of every head that shares the KV head — G = H / H_kv heads times N_q queries — are stacked
into one Q tile, so each K/V tile is read from HBM once per KV head, not once per query head.
The program streams the K/V tiles of its contiguous key range [k_start, k_end) of the valid cache
with the online softmax: tiles every row fully sees run without a mask (off-band), the last few
tiles (the cache end, and the causal diagonal when N_q > 1) apply the per-row bound
j <= cache_seqlens[b] - N_q + t (on-band). With one split it normalises and writes O directly
(FlashAttention-2's schedule); with several it writes a partial output O_j = acc_j / l_j and its
state (m_j, l_j) in natural units.

Stage 2 (`decode_merge_kernel`): one program per stacked row (b, kv_head, r) merges the
partials with the seeds' formula: m = max_j m_j, O = sum_j e^(m_j - m) l_j O_j / sum_j e^(m_j - m) l_j,
lse = m + log(sum_j e^(m_j - m) l_j).

Tracing is switched on by `tl.constexpr` flags, as in flash_kernel: with TRACE off no trace code
is compiled. HW_CLOCK (%globaltimer, %smid through inline PTX) is only set on CUDA; the
interpreter records the order programs ran in through a counter instead.
"""

from .runtime import choose_backend

choose_backend()  # before triton is imported, also when this module is imported on its own

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .flash_kernel import _globaltimer, _smid  # noqa: E402  (one implementation of each clock)

LN2 = tl.constexpr(0.6931471805599453)
LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _kv_loop(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, offs_d, row_pos,
             lo, hi, qk_scale,
             HEAD_DIM: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_N: tl.constexpr,
             ON_BAND: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr):
    """Online softmax over the keys [lo, hi) in BLOCK_N steps; scores in log2 units."""
    offs_n0 = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + offs_n0
        # -- load K^T, compute qk --
        k_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None]          # (D, BLOCK_N)
        v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :]          # (BLOCK_N, D)
        if ON_BAND:
            k = tl.load(k_ptrs, mask=(offs_n[None, :] < hi) & d_ok[:, None], other=0.0)
        elif EVEN_D:
            k = tl.load(k_ptrs)
        else:
            k = tl.load(k_ptrs, mask=d_ok[:, None], other=0.0)
        if UPCAST_DOT:
            k = k.to(tl.float32)
        qk = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale             # (BLOCK_M, BLOCK_N)
        if ON_BAND:
            # key j is visible to row r when j < hi (this split's end) and j <= row_pos[r]
            visible = (offs_n[None, :] < hi) & (offs_n[None, :] <= row_pos[:, None])
            qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # a row that has seen no visible key yet keeps m = -inf; subtract 0 instead of -inf
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk - m_ref[:, None])
        alpha = tl.math.exp2(m_i - m_ref)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        # -- load V, accumulate --
        if ON_BAND:
            v = tl.load(v_ptrs, mask=(offs_n[:, None] < hi) & d_ok[None, :], other=0.0)
        elif EVEN_D:
            v = tl.load(v_ptrs)
        else:
            v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
        if UPCAST_DOT:
            # bf16 operands, rounded as on the GPU, multiplied in fp32 (the interpreter's bf16 dot is broken)
            acc = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def decode_split_kernel(Q, K, V, O, LSE, O_part, M_part, L_part, seqlens,
                        stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                        stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
                        tr_splits, tr_counter,
                        H_KV, N_Q, ROWS, num_splits, qk_scale,
                        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                        STORE_LSE: tl.constexpr, STORE_STATS: tl.constexpr,
                        DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr,
                        TRACE: tl.constexpr, HW_CLOCK: tl.constexpr):
    if TRACE and HW_CLOCK:
        t_start = _globaltimer()
    split = tl.program_id(0)
    bkv = tl.program_id(1)                       # b * H_kv + kv_head
    row_block = tl.program_id(2)
    off_b = (bkv // H_KV).to(tl.int64)
    off_kv = (bkv % H_KV).to(tl.int64)
    # -- the stacked Q tile: row r is query t = r % N_q of head kv_head * G + r // N_q --
    offs_r = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_r < ROWS
    head = off_kv * GROUP + offs_r // N_Q
    t = offs_r % N_Q
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    q_ptrs = Q + off_b * stride_qb + head[:, None] * stride_qh + t[:, None] * stride_qn + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)      # (BLOCK_M, D)
    if UPCAST_DOT:
        q = q.to(tl.float32)
    # -- this split's key range of the valid cache, in whole BLOCK_N tiles --
    seq_len = tl.load(seqlens + off_b)
    n_blocks = tl.cdiv(seq_len, BLOCK_N)
    blocks_per_split = tl.cdiv(n_blocks, num_splits)
    k_start = tl.minimum(split * blocks_per_split * BLOCK_N, seq_len)
    k_end = tl.minimum((split + 1) * blocks_per_split * BLOCK_N, seq_len)
    # bottom-right causal: query t sits at key position seq_len - N_q + t; padded rows see nothing
    row_pos = tl.where(row_ok, seq_len - N_Q + t, -1)
    # keys every row sees (j <= seq_len - N_q) need no mask: whole tiles of them run off-band
    all_see = tl.maximum(tl.minimum(k_end, seq_len - N_Q + 1), k_start)
    k_mid = k_start + (all_see - k_start) // BLOCK_N * BLOCK_N
    k_base = K + off_b * stride_kb + off_kv * stride_kh
    v_base = V + off_b * stride_vb + off_kv * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    # -- off-band: whole tiles, no element mask --
    acc, l_i, m_i = _kv_loop(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, offs_d, row_pos,
                             k_start, k_mid, qk_scale, HEAD_DIM, HEAD_DIM == HEAD_DIM_PAD, BLOCK_N,
                             False, DOT_PRECISION, UPCAST_DOT)
    # -- on-band: the cache end and the causal diagonal, masked per row --
    acc, l_i, m_i = _kv_loop(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_vn, offs_d, row_pos,
                             k_mid, k_end, qk_scale, HEAD_DIM, HEAD_DIM == HEAD_DIM_PAD, BLOCK_N,
                             True, DOT_PRECISION, UPCAST_DOT)
    # -- epilogue: normalise once; a row that saw no key (l = 0) writes 0 --
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    m_nat = m_i * LN2                                       # natural units: max of q.k * sm_scale
    if SPLIT:
        part = (bkv.to(tl.int64) * num_splits + split) * ROWS + offs_r             # (B, H_kv, S, R)
        tl.store(O_part + part[:, None] * HEAD_DIM + offs_d[None, :], out,
                 mask=row_ok[:, None] & d_ok[None, :])
    else:
        o_ptrs = O + off_b * stride_ob + head[:, None] * stride_oh + t[:, None] * stride_on + offs_d[None, :]
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
        if STORE_LSE:
            lse = tl.where(seen, m_nat + tl.log(tl.where(seen, l_i, 1.0)), float("-inf"))
            tl.store(LSE + (off_b * H_KV * GROUP + head) * N_Q + t, lse, mask=row_ok)
    if SPLIT or STORE_STATS:
        part = (bkv.to(tl.int64) * num_splits + split) * ROWS + offs_r
        tl.store(M_part + part, m_nat, mask=row_ok)
        tl.store(L_part + part, l_i, mask=row_ok)
    # -- trace: one record per program (compiled away when TRACE is off) --
    if TRACE:
        program = split + num_splits * (bkv + tl.num_programs(1) * row_block)
        rec = tr_splits + program.to(tl.int64) * 6
        if HW_CLOCK:
            tl.store(rec + 1, _smid().to(tl.int64))
            tl.store(rec + 2, t_start)
            tl.store(rec + 3, _globaltimer())
        else:
            # no clock in the interpreter: a counter gives the order programs ran in
            tl.store(rec, tl.atomic_add(tr_counter, 1).to(tl.int64))
        tl.store(rec + 4, k_start.to(tl.int64))
        tl.store(rec + 5, k_end.to(tl.int64))


@triton.jit
def decode_merge_kernel(O_part, M_part, L_part, O, LSE, stride_ob, stride_oh, stride_on,
                        tr_merge, H_KV, N_Q, ROWS, num_splits,
                        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                        SPLITS_PAD: tl.constexpr, SPLIT_CHUNK: tl.constexpr, STORE_LSE: tl.constexpr,
                        TRACE: tl.constexpr, HW_CLOCK: tl.constexpr):
    # one program per stacked row: its loads are independent of each other, so the merge costs
    # about one round trip to memory instead of one per split
    if TRACE and HW_CLOCK:
        t_start = _globaltimer()
    pid = tl.program_id(0)                                   # (b * H_kv + kv_head) * rows + r
    bkv = pid // ROWS
    r = pid % ROWS
    off_b = (bkv // H_KV).to(tl.int64)
    off_kv = (bkv % H_KV).to(tl.int64)
    base = bkv.to(tl.int64) * num_splits * ROWS + r         # split 0 of this row in (B, H_kv, S, rows)
    # -- m = max_j m_j (splits that saw nothing hold -inf) --
    offs_s = tl.arange(0, SPLITS_PAD)
    m = tl.max(tl.load(M_part + base + offs_s * ROWS, mask=offs_s < num_splits, other=float("-inf")), 0)
    m_ref = tl.where(m == float("-inf"), 0.0, m)
    # -- O = sum_j e^(m_j - m) l_j O_j / sum_j e^(m_j - m) l_j --
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    acc = tl.zeros([HEAD_DIM_PAD], dtype=tl.float32)
    denom = tl.sum(tl.zeros([SPLIT_CHUNK], dtype=tl.float32), 0)
    for c in range(0, num_splits, SPLIT_CHUNK):
        offs_c = c + tl.arange(0, SPLIT_CHUNK)
        c_ok = offs_c < num_splits
        m_j = tl.load(M_part + base + offs_c * ROWS, mask=c_ok, other=float("-inf"))
        l_j = tl.load(L_part + base + offs_c * ROWS, mask=c_ok, other=0.0)
        w = tl.math.exp2((m_j - m_ref) * LOG2E) * l_j                     # (SPLIT_CHUNK,)
        o_j = tl.load(O_part + (base + offs_c * ROWS)[:, None] * HEAD_DIM + offs_d[None, :],
                      mask=c_ok[:, None] & d_ok[None, :], other=0.0)       # (SPLIT_CHUNK, D)
        acc += tl.sum(w[:, None] * o_j, 0)
        denom += tl.sum(w, 0)
    seen = denom > 0.0
    out = acc / tl.where(seen, denom, 1.0)
    head = off_kv * GROUP + r // N_Q
    t = r % N_Q
    tl.store(O + off_b * stride_ob + head * stride_oh + t * stride_on + offs_d, out.to(O.dtype.element_ty),
             mask=d_ok)
    if STORE_LSE:
        lse = tl.where(seen, m_ref + tl.log(tl.where(seen, denom, 1.0)), float("-inf"))
        tl.store(LSE + (off_b * H_KV * GROUP + head) * N_Q + t, lse)
    if TRACE:
        if HW_CLOCK:
            rec = tr_merge + pid.to(tl.int64) * 3
            tl.store(rec, _smid().to(tl.int64))
            tl.store(rec + 1, t_start)
            tl.store(rec + 2, _globaltimer())
