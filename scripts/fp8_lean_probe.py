"""GPU probe: why scripts/fp8_halves_probe.py's one-chain kernel ("h1") computes the same bits as the FP8
kernel's warp-specialised full-mask launch 1-6 % faster. Lean kernels on the product's own launch arguments,
each keeping one part of the product: fp8_lean_tiles (a lean work item around the product's fp8_tiles loop),
and for bf16 bf16_lean (a lean work item around the product's attend_tiles loop); outputs compared bit for bit
with the product's, every variant timed in ROUNDS rotated rounds.

    python scripts/fp8_lean_probe.py OUT_DIR      (a CUDA GPU; writes OUT_DIR/fp8-lean-probe.json)"""
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(__file__))
import fp8_halves_probe as hp  # noqa: E402
from benchmarks.rotated import medians, time_rotated  # noqa: E402
from kernels import flash_attention  # noqa: E402
from kernels.flash_kernel import SIZES as BF_SIZES, _device_descs  # noqa: E402
from kernels.fp8 import _resolve, attention_fp8  # noqa: E402
from kernels.fp8_kernel import P_SCALE, SIZES, fp8_tiles  # noqa: E402
from kernels.fp8_quant import quantize_fp8  # noqa: E402
from kernels.launch import _ensure_allocator, kernel_launches, resolve_launch  # noqa: E402
from kernels.masks import parse_mask  # noqa: E402
from kernels.tile_ops import attend_tiles, normalise_rows  # noqa: E402

ROUNDS = 5
rows = []
@triton.jit(do_not_specialize=SIZES)
def fp8_lean_tiles(Q8, K8, V8, O, LSE, scales, q8_strides, kv8_strides, o_strides, lists, work_list,
                   tr_work, tr_counter, tr_tiles, tr_rows, row_slot, head_slot, trace_slots,
                   H, GROUP, N_Q, N_K, n_qb, n_kb, n_work, qk_scale,
                   TILE: tl.constexpr, TRACE: tl.constexpr, RETURN_LSE: tl.constexpr):
    """attn_fwd_fp8_kernel's warp-specialised full-tile launch as a lean work item around its fp8_tiles loop."""
    BLOCK_M: tl.constexpr = TILE.BLOCK_M
    HEAD_DIM: tl.constexpr = TILE.HEAD_DIM
    BLOCK_N: tl.constexpr = TILE.BLOCK_N
    pid = tl.program_id(0)
    work = tl.load(work_list + pid)
    q_scale, k_scale, v_scale = scales
    stride_kbh, stride_vbh, stride_vd = kv8_strides
    stride_ob, stride_oh, stride_on = o_strides
    lo_ptr, hi_ptr, full_cnt, full_start, part_cnt, part_idx = lists
    bh = work // n_qb
    q_block = work % n_qb
    kv_bh = (bh // H) * (H // GROUP) + (bh % H) // GROUP
    offs_d = tl.arange(0, HEAD_DIM)
    q_desc = tl.make_tensor_descriptor(Q8, [(n_work // n_qb) * n_qb * BLOCK_M, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_M, HEAD_DIM])
    q = q_desc.load([(bh * n_qb + q_block) * BLOCK_M, 0])
    scale = qk_scale * tl.load(q_scale + bh * n_qb + q_block)
    kv_heads = n_work // n_qb // GROUP
    k_desc = tl.make_tensor_descriptor(K8, [kv_heads * n_kb * BLOCK_N, HEAD_DIM], [HEAD_DIM, 1], [BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(V8, [kv_heads * HEAD_DIM, n_kb * BLOCK_N], [stride_vd, 1], [HEAD_DIM, BLOCK_N])
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    s_v = tl.full([], 1.0, dtype=tl.float32)
    kv = (K8, V8, k_scale + kv_bh * n_kb, v_scale + kv_bh * n_kb, kv_bh * n_kb * BLOCK_N, kv_bh * HEAD_DIM)
    full_run = (part_idx, tl.load(full_start + q_block), tl.load(full_cnt + q_block), 0, stride_vd)
    acc, l_i, m_i, s_v = fp8_tiles(acc, l_i, m_i, s_v, q, kv, (offs_d, 0, 0), full_run, scale, k_desc=k_desc,
                                   v_desc=v_desc, tiles_ptr=tr_tiles, rows_ptr=tr_rows, n_kb=n_kb,
                                   trace_tiles_here=False, trace_rows_here=False, TILE=TILE,
                                   IS_PARTIAL=False, WARP_SPECIALIZE=TILE.WARP_SPECIALIZE, TRACE=TRACE)
    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    o_base = O + (bh // H).to(tl.int64) * stride_ob + (bh % H).to(tl.int64) * stride_oh + offs_d[None, :]
    out, lse = normalise_rows(acc * (s_v / P_SCALE), l_i / P_SCALE, m_i, True)
    tl.store(o_base + offs_m[:, None] * stride_on, out.to(O.dtype.element_ty))
    if RETURN_LSE:
        tl.store(LSE + bh.to(tl.int64) * N_Q + offs_m, lse)


@triton.jit(do_not_specialize=BF_SIZES)
def bf16_lean(Q, K, V, O, q_strides, k_strides, v_strides, o_strides, OA, oa_strides, LSE, stride_lbh,
              lists, q_desc, k_desc, v_desc, work_list,
              tr_work, tr_counter, tr_tiles, tr_rows, row_slot, head_slot, trace_slots,
              H, GROUP, N_Q, N_K, n_qb, n_kb, n_work, qk_scale,
              TILE: tl.constexpr, LOOP: tl.constexpr, PHASE: tl.constexpr, TRACE: tl.constexpr):
    """attn_fwd_kernel's warp-specialised full-tile launch as a lean work item around its attend_tiles loop."""
    BLOCK_M: tl.constexpr = TILE.BLOCK_M
    HEAD_DIM: tl.constexpr = TILE.HEAD_DIM
    pid = tl.program_id(0)
    q_desc, k_desc, v_desc = _device_descs(Q, K, V, n_work // n_qb, GROUP, N_Q, N_K, q_strides[2], k_strides[2],
                                           v_strides[2], TILE=TILE)
    work = tl.load(work_list + pid)
    lo_ptr, hi_ptr, full_cnt, full_start, part_cnt, part_idx = lists
    bh = work // n_qb
    q_block = work % n_qb
    off_b = (bh // H).to(tl.int64)
    off_h = (bh % H).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    q = q_desc.load([bh * N_Q + q_block * BLOCK_M, 0])
    kv_row_base = ((bh // H) * (H // GROUP) + (bh % H) // GROUP) * N_K
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    kv = (K, V, k_strides[2], v_strides[2], kv_row_base)
    rows = (offs_d, offs_d < TILE.head_dim, 0, 0)
    full_run = (part_idx, tl.load(full_start + q_block), tl.load(full_cnt + q_block), 0, N_K)
    acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, kv, rows, full_run, qk_scale, k_desc=k_desc, v_desc=v_desc,
                                 tiles_ptr=tr_tiles, rows_ptr=tr_rows, n_kb=n_kb, trace_tiles_here=False,
                                 trace_rows_here=False, TILE=TILE, IS_PARTIAL=False, USE_TMA=True,
                                 WARP_SPECIALIZE=LOOP.WARP_SPECIALIZE, ROWSUM_MMA=LOOP.ROWSUM_MMA, TRACE=TRACE)
    out, lse = normalise_rows(acc, l_i, m_i, PHASE.SAFE_DIV)
    offs_m = q_block * BLOCK_M + tl.arange(0, BLOCK_M)
    o_base = O + off_b * o_strides[0] + off_h * o_strides[1] + offs_d[None, :]
    tl.store(o_base + offs_m[:, None] * o_strides[2], out.to(O.dtype.element_ty))
    if PHASE.RETURN_LSE:
        tl.store(LSE + bh.to(tl.int64) * stride_lbh + offs_m, lse)


def timeit(tag, fns, fl):
    """Check every variant against 'head' bit for bit, then time them in ROUNDS rotated rounds."""
    outs = {key: fn().float() for key, fn in fns.items()}
    for key in fns:
        print(tag, key, "equal to head:", torch.equal(outs[key], outs["head"]), flush=True)
    times = time_rotated(fns, ROUNDS)
    med = medians(times)
    for key, ts in times.items():
        rows.append(dict(case=tag, label=key, ms=med[key], tflops=fl / med[key] / 1e9, x_head=med["head"] / med[key], rounds=ts))
        print(f"  {tag} {key:22s} {med[key]:.3f} ms {fl / med[key] / 1e9:6.0f} TFLOP/s x{med['head'] / med[key]:.3f} vs head", flush=True)


if __name__ == "__main__":
    _ensure_allocator()
    for n, d in ((4096, 256), (4096, 128), (8192, 128)):
        b, h = 4, 16
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        fl = 4 * b * h * n * n * d
        # FP8
        x = quantize_fp8(q, k, v, "block", True, mask="full")
        fp = _resolve(x, parse_mask("full", n, n), False, None, True, None)
        launch = fp.launches[0]
        assert launch.ws
        o = torch.empty(x.shape, dtype=x.dtype, device="cuda")
        call = dict(Q8=x.q, K8=x.k, V8=x.v, O=o, LSE=None, scales=(x.q_scale, x.k_scale, x.v_scale), qk_scale=d ** -0.5 * 1.4426950408889634,
                    **dict.fromkeys(("tr_work", "tr_counter", "tr_tiles", "tr_rows", "row_slot", "head_slot", "trace_slots")))
        args = launch.args.bind(**call)
        def lean8():
            fp8_lean_tiles[fp.grid](*args, **launch.options)
            return o
        timeit(f"fp8 full {n} D{d}", {"head": lambda: attention_fp8(x, "full"), "lean + fp8_tiles": lean8,
                                      "probe copy": hp.h2_run(x, 1, 4, 2)}, fl)
        # bf16
        lp = resolve_launch(q, k, v, "full", None, None, "natural", None, None, False, None, True, None, None, False, False, "all")
        (o16, ), launches = (lambda r: ((r[0] if not isinstance(r[0], tuple) else r[0][0],), r[1]))(kernel_launches(lp, q, k, v))
        assert len(launches) == 1 and launches[0][1].ws, launches
        bargs, blaunch = launches[0]
        def lean16():
            bf16_lean[lp.grid](*bargs, **blaunch.options)
            return o16
        timeit(f"bf16 full {n} D{d}", {"head": lambda: flash_attention(q, k, v, mask="full"), "lean + attend_tiles": lean16}, fl)
    json.dump(dict(meta=dict(device=torch.cuda.get_device_name(), triton=triton.__version__, command="python scripts/fp8_lean_probe.py OUT_DIR"), records=rows),
              open(os.path.join(sys.argv[1], "fp8-lean-probe.json"), "w"), indent=1)
