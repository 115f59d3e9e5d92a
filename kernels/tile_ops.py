"""The @triton.jit pieces the attention kernels share: the hardware clocks, the K/V tile load,
the online-softmax step, the P.V accumulate and the merge of two normalised results.

Every kernel file (flash_kernel, varlen_kernel, decode_kernel, backward_kernel) imports these
from here and nothing from another kernel file, so a piece has one implementation and a change
to it reaches every kernel. Scores are kept in log2 units (the softmax scale is folded with
log2(e) into one multiply, so the exponentials are exp2); LN2 turns them back into natural units.

The clocks read %globaltimer, %clock64 and %smid through inline PTX, which the CPU interpreter
cannot run: a kernel calls them only under its HW_CLOCK constexpr (set on CUDA alone).
"""

from .runtime import choose_backend

choose_backend()  # before triton is imported, also when this module is imported on its own

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def globaltimer():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def clock64():
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def smid():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32,
                                     is_pure=True, pack=1)


KV_EVICT_NORMAL = tl.constexpr("")    # tl.load's default L2 policy, as a constexpr to pass along


@triton.jit
def load_kv_tile(ptrs, n_ok, d_ok, MASK_N: tl.constexpr, EVEN_D: tl.constexpr, EVICT: tl.constexpr):
    """One K or V tile by pointers (flash and decode loops). n_ok, d_ok: the key and head-dim
    bounds, broadcast to the tile's layout; a mask is applied only where it can be false, so
    full tiles of an unpadded head dim load 16 bytes wide. EVICT: the L2 eviction policy
    (decode streams its cache once: "evict_first"; flash: KV_EVICT_NORMAL). No default: Triton 3.6
    does not wrap a jit helper's default str as a constexpr (the flash kernel failed to compile)."""
    if MASK_N:
        if EVEN_D:
            x = tl.load(ptrs, mask=n_ok, other=0.0, eviction_policy=EVICT)
        else:
            x = tl.load(ptrs, mask=n_ok & d_ok, other=0.0, eviction_policy=EVICT)
    elif EVEN_D:
        x = tl.load(ptrs, eviction_policy=EVICT)
    else:
        x = tl.load(ptrs, mask=d_ok, other=0.0, eviction_policy=EVICT)              # padded D: zeros
    return x


@triton.jit
def merge_normalised(o_a, lse_a, o_b, lse_b):
    """Two normalised results of the same rows over disjoint keys, (O (rows, D), lse natural log)
    each, merged: the online-softmax merge in lse form, w = e^(lse - lse_new), O = w_a O_a + w_b O_b.
    Rows neither has seen stay (0, -inf). The flash kernel's MERGE epilogue and kernels.ring_merge."""
    top = tl.maximum(lse_a, lse_b)
    top = tl.where(top == float("-inf"), 0.0, top)          # both -inf: weights 0, not NaN
    w_a = tl.exp(lse_a - top)
    w_b = tl.exp(lse_b - top)
    total = w_a + w_b
    seen = total > 0
    inv = tl.where(seen, 1.0 / tl.where(seen, total, 1.0), 0.0)
    o = o_a * (w_a * inv)[:, None] + o_b * (w_b * inv)[:, None]
    lse = tl.where(seen, top + tl.log(tl.where(seen, total, 1.0)), float("-inf"))
    return o, lse


@triton.jit
def accumulate_pv(acc, p, v, DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr):
    """acc + P.V with P rounded to V's dtype, as the tensor cores take it."""
    if UPCAST_DOT:
        # bf16 operands, rounded as on the GPU, multiplied in fp32 (the interpreter's bf16 dot is broken)
        acc = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def softmax_update(qk, m_i, offs_n, row_lo, row_hi, qk_scale, MASKED: tl.constexpr):
    """One tile's online-softmax step on raw scores qk (BLOCK_M, BLOCK_N) in log2 units (flash and
    varlen loops). MASKED: keys outside each row's [row_lo, row_hi] get -inf, and a row with no
    visible key yet keeps m = -inf (0 is subtracted); unmasked: scale and shift in one FMA per score.
    Returns (p, alpha = 2^(m_i - m_new), m_new); the caller rescales l and acc by alpha."""
    if MASKED:
        visible = (offs_n[None, :] >= row_lo[:, None]) & (offs_n[None, :] <= row_hi[:, None])
        qk = tl.where(visible, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        qk = qk - m_ref[:, None]
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_ref = m_new
        qk = qk * qk_scale - m_ref[:, None]
    p = tl.math.exp2(qk)
    alpha = tl.math.exp2(m_i - m_ref)
    return p, alpha, m_new
