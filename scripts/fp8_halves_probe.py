"""GPU probe (a refuted hypothesis, kept to rerun): the FP8 kernel's warp-specialised full-tile launch with the
query block's rows in HALVES independent chains, so that one chain's softmax could run under the other's
wgmma (FlashAttention-3's intra-warpgroup overlap), against today's default launch and cuDNN bf16; full mask.

    python scripts/fp8_halves_probe.py OUT_DIR      (a CUDA GPU; on a CPU: TRITON_INTERPRET=1, a small check)

The probe kernel takes attn_fwd_fp8_kernel's arguments as kernels.fp8 binds them for the warp-specialised
launch (HALVES added): "h1" is that launch's loop alone (no trace, seed or partial-tile code), "h2" two
chains of BLOCK_M / 2 rows. Triton 3.6 already splits a 128-row tile over two consumer warpgroups of 64
rows, so "h2 256xN" gives each warpgroup two 64-row chains. Every variant is checked against bf16 SDPA
(relative error within 1.2x the default's), then timed in ROUNDS rounds with the order rotated, the default
twice. Writes OUT_DIR/fp8-halves-probe.json."""
import os
import sys

import torch
import torch.nn.functional as Fn
import triton
import triton.language as tl

from benchmarks.rotated import medians, time_rotated
from kernels.fp8 import _resolve, attention_fp8
from kernels.fp8_kernel import LOG2_P_SCALE, P_SCALE, SIZES
from kernels.fp8_quant import quantize_fp8
from kernels.launch import _ensure_allocator
from kernels.masks import parse_mask
from kernels.tile_ops import cast_e4m3, normalise_rows, softmax_update

DEV = "cuda" if torch.cuda.is_available() else "cpu"
LOG2E = 1.4426950408889634
ROUNDS = 3
rows = []


@triton.jit
def _chain(q, k, v, acc, l_i, m_i, ratio, scale, offs_n, ROUND_FIRST: tl.constexpr):
    qk = tl.dot(q, k)
    p, alpha, m_new = softmax_update(qk, m_i, offs_n, 0, 0, scale, False, LOG2_P_SCALE)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * (alpha * ratio)[:, None]
    acc = tl.dot(cast_e4m3(p, ROUND_FIRST), tl.trans(v), acc)
    return acc, l_i, m_new


@triton.jit(do_not_specialize=SIZES)
def attn_fwd_fp8_h2(Q8, K8, V8, O, LSE, scales, q8_strides, kv8_strides, o_strides, lists, work_list,
                    tr_work, tr_counter, tr_tiles, tr_rows, row_slot, head_slot, trace_slots,
                    H, GROUP, N_Q, N_K, n_qb, n_kb, n_work, qk_scale,
                    TILE: tl.constexpr, TRACE: tl.constexpr, RETURN_LSE: tl.constexpr, HALVES: tl.constexpr):
    """attn_fwd_fp8_kernel's full-tile loop alone (untraced, no seed, no partial tiles), its query
    block's rows in HALVES chains of BLOCK_M / HALVES rows that share each K/V tile."""
    BLOCK_M: tl.constexpr = TILE.BLOCK_M
    HM: tl.constexpr = BLOCK_M // HALVES
    HEAD_DIM: tl.constexpr = TILE.HEAD_DIM
    BLOCK_N: tl.constexpr = TILE.BLOCK_N
    ROUND_FIRST: tl.constexpr = TILE.ROUND_FIRST
    WS: tl.constexpr = TILE.WARP_SPECIALIZE
    pid = tl.program_id(0)
    work = tl.load(work_list + pid)
    q_scale, k_scale, v_scale = scales
    stride_qbh, stride_qn = q8_strides
    stride_kbh, stride_vbh, stride_vd = kv8_strides
    stride_ob, stride_oh, stride_on = o_strides
    lo_ptr, hi_ptr, full_cnt, full_start, part_cnt, part_idx = lists
    bh = work // n_qb
    q_block = work % n_qb
    kv_bh = (bh // H) * (H // GROUP) + (bh % H) // GROUP
    offs_d = tl.arange(0, HEAD_DIM)
    q_desc = tl.make_tensor_descriptor(Q8, [(n_work // n_qb) * n_qb * BLOCK_M, HEAD_DIM], [HEAD_DIM, 1], [HM, HEAD_DIM])
    q0 = q_desc.load([(bh * n_qb + q_block) * BLOCK_M, 0])
    scale = qk_scale * tl.load(q_scale + bh * n_qb + q_block)
    kv_heads = n_work // n_qb // GROUP
    k_desc = tl.make_tensor_descriptor(K8, [kv_heads * n_kb * BLOCK_N, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(V8, [kv_heads * HEAD_DIM, n_kb * BLOCK_N], [stride_vd, 1], [HEAD_DIM, BLOCK_N])
    k_row = kv_bh * n_kb * BLOCK_N
    v_row = kv_bh * HEAD_DIM
    ks = k_scale + kv_bh * n_kb
    vs = v_scale + kv_bh * n_kb
    m0 = tl.full([HM], float("-inf"), dtype=tl.float32)
    l0 = tl.zeros([HM], dtype=tl.float32)
    a0 = tl.zeros([HM, HEAD_DIM], dtype=tl.float32)
    if HALVES == 2:
        q1 = q_desc.load([(bh * n_qb + q_block) * BLOCK_M + HM, 0])
        m1 = tl.full([HM], float("-inf"), dtype=tl.float32)
        l1 = tl.zeros([HM], dtype=tl.float32)
        a1 = tl.zeros([HM, HEAD_DIM], dtype=tl.float32)
    s_v = tl.full([], 1.0, dtype=tl.float32)
    kb_start = tl.load(full_start + q_block)
    count = tl.load(full_cnt + q_block)
    offs_n0 = tl.arange(0, BLOCK_N)
    for i in tl.range(0, count, warp_specialize=WS):
        k_block = kb_start + i
        offs_n = k_block * BLOCK_N + offs_n0
        s_k = tl.load(ks + k_block)
        s_new = tl.load(vs + k_block)
        k = tl.trans(k_desc.load([k_row + k_block * BLOCK_N, 0]))
        v = v_desc.load([v_row, k_block * BLOCK_N])
        ratio = s_v / s_new
        a0, l0, m0 = _chain(q0, k, v, a0, l0, m0, ratio, scale * s_k, offs_n, ROUND_FIRST)
        if HALVES == 2:
            a1, l1, m1 = _chain(q1, k, v, a1, l1, m1, ratio, scale * s_k, offs_n, ROUND_FIRST)
        s_v = s_new
    offs_m = q_block * BLOCK_M + tl.arange(0, HM)
    o_base = O + (bh // H).to(tl.int64) * stride_ob + (bh % H).to(tl.int64) * stride_oh + offs_d[None, :]
    out, lse = normalise_rows(a0 * (s_v / P_SCALE), l0 / P_SCALE, m0, True)
    tl.store(o_base + offs_m[:, None] * stride_on, out.to(O.dtype.element_ty))
    if RETURN_LSE:
        tl.store(LSE + bh.to(tl.int64) * N_Q + offs_m, lse)
    if HALVES == 2:
        out, lse = normalise_rows(a1 * (s_v / P_SCALE), l1 / P_SCALE, m1, True)
        tl.store(o_base + (offs_m + HM)[:, None] * stride_on, out.to(O.dtype.element_ty))
        if RETURN_LSE:
            tl.store(LSE + bh.to(tl.int64) * N_Q + offs_m + HM, lse)


def h2_run(x, halves, warps, stages):
    """A launch of the probe kernel on the arguments kernels.fp8 binds for x's full-mask launch."""
    b, h, n, d = x.shape
    spec = parse_mask("full", n, x.n_k)
    fp = _resolve(x, spec, False, None, DEV == "cuda", True if DEV == "cuda" else None)
    launch = fp.launches[0]
    tile = launch.args.value("TILE")
    if DEV == "cuda":
        assert tile.WARP_SPECIALIZE, tile
    o = torch.empty(x.shape, dtype=x.dtype, device=DEV)
    call = dict(Q8=x.q, K8=x.k, V8=x.v, O=o, LSE=None, scales=(x.q_scale, x.k_scale, x.v_scale),
                qk_scale=d ** -0.5 * LOG2E, tr_work=None, tr_counter=None, tr_tiles=None, tr_rows=None, row_slot=None,
                head_slot=None, trace_slots=None)
    args = launch.args.bind(**call)
    def run():
        attn_fwd_fp8_h2[fp.grid](*args, HALVES=halves, num_warps=warps, num_stages=stages)
        return o
    return run


def case(n, d, variants, b=4, h=16):
    g = torch.Generator(device=DEV).manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device=DEV, dtype=torch.bfloat16, generator=g) for _ in range(3))
    def cudnn():
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            return Fn.scaled_dot_product_attention(q, k, v)
    x0 = quantize_fp8(q, k, v, "block", True, mask="full")
    default = lambda: attention_fp8(x0, "full")
    ref = (cudnn() if DEV == "cuda" else Fn.scaled_dot_product_attention(q.float(), k.float(), v.float())).float()
    base_err = ((default().float() - ref).norm() / ref.norm()).item()
    print(f"fp8 {n} D{d} default: rel err vs bf16 SDPA {base_err:.3e}", flush=True)
    fns = {"cudnn bf16": cudnn, "default": default} if DEV == "cuda" else {"default": default}
    for label, (bm, bn, halves, warps, stages) in variants:
        x = quantize_fp8(q, k, v, "block", True, bm, bn, mask="full")
        run = h2_run(x, halves, warps, stages)
        o = run().float()
        if DEV == "cuda":
            torch.cuda.synchronize()
        err = ((o - ref).norm() / ref.norm()).item()
        print(f"fp8 {n} D{d} {label}: rel err vs bf16 SDPA {err:.3e}", flush=True)
        if not err < 1.2 * base_err:
            continue
        fns[label] = run
    if DEV != "cuda":
        return
    fns["default again"] = default
    times = time_rotated(fns, ROUNDS)
    fl = 4 * b * h * n * n * d
    med = medians(times)
    for key, ts in times.items():
        ms = med[key]
        rows.append(dict(n=n, head_dim=d, batch=b, heads=h, label=key, ms=ms, tflops=fl / ms / 1e9,
                         x_default=med["default"] / ms, x_cudnn=med["cudnn bf16"] / ms, rounds=ts))
        print(f"  fp8 full {n:5d} D{d} {key:24s} {ms:7.3f} ms {fl / ms / 1e9:6.0f} TFLOP/s  x{med['default'] / ms:.3f} vs default"
              f"  {med['cudnn bf16'] / ms:.3f}x cuDNN", flush=True)
    __import__('json').dump(dict(meta=dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                             command="python scripts/fp8_halves_probe.py OUT_DIR", mask="full",
                             timing=f"benchmarks.rotated: do_bench median (warmup 25 ms, rep 80 ms) per round, {ROUNDS} rounds, order rotated each round, median over rounds"),
                   records=rows), open(os.path.join(sys.argv[1], "fp8-halves-probe.json"), "w"), indent=1)

if DEV == "cuda":
    _ensure_allocator()
V128 = [("h1 128x256", (128, 256, 1, 4, 2)), ("h2 256x128", (256, 128, 2, 4, 2)), ("h2 256x64", (256, 64, 2, 4, 2)),
        ("h2 256x64 s3", (256, 64, 2, 4, 3)), ("h1 128x128", (128, 128, 1, 4, 2))]
if __name__ == "__main__" and DEV == "cuda":
    for n in (4096, 8192, 16384):
        case(n, 128, V128)
    case(4096, 256, [("h1 128x128", (128, 128, 1, 4, 2)), ("h2 256x64", (256, 64, 2, 4, 2))])
elif __name__ == "__main__":
    case(512, 64, [("h1 128x256", (128, 256, 1, 4, 2)), ("h2 256x128", (256, 128, 2, 4, 2))], b=1, h=2)
