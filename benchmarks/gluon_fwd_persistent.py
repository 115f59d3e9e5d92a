"""A probe, not a product path: the Gluon forward (kernels.gluon_fwd_kernel) as a persistent kernel,
FlashAttention-3's scheduling. One program per SM walks its list of work items (program p takes
places p, p + G, p + 2G, ... of the plan's work list, or with schedule 'lpt' the items dealt
longest first to the least loaded program, kernels.plan.program_lists); its producer loads the
next item's Q into the second of two Q buffers and its K / V tiles into the same ring while the
consumers finish the item before (its last P V and epilogue), where one program per item starts
each item cold. Nsight Compute on the product kernel at D 64 full 4k: 2,048 programs in 15.5 waves
of 132, tensor pipe active 46% against cuDNN's persistent kernel's 51% (docs/performance.md).

Each item runs the product kernel's partitions' code (`_producer`, `_consumer` at a Q slot and
ring position), so O and lse equal the product kernel's bit for bit. Contiguous q, k, v, D 64 or
128 (two Q buffers and D 256's ring do not fit shared memory), untraced. Timed against the product
kernel by `scripts/gluon_fwd_probe.py --persistent`.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from kernels.gluon_fwd_kernel import _consumer, _producer, block_lists, kv_ring_barriers, two_items_q, work_item

ITEM_COST = 5.0     # a bf16 work item's cost beyond its tiles, in tiles (item-cost-nvidia-h200.json: 7.2 µs / 1.42 µs)


@gluon.jit
def _item(works, w, H, GROUP, N_Q, N_K, n_qb, full_cnt, full_start, part_cnt, part_idx, n_kb):
    """Work item works[w] (w: a place in the programs' lists): its Q rows (head-major), first query row in its head, K / V rows, and
    block lists (full count, first full block, tiles, partial list)."""
    bh, q_block, bh_kv, row0 = work_item(gl.load(works + w), H, GROUP, n_qb)
    n_full, first_full, n_tiles, part_list = block_lists(q_block, full_cnt, full_start, part_cnt, part_idx, n_kb)
    return bh * N_Q + row0, row0, bh_kv * N_K, n_full, first_full, n_tiles, part_list


@gluon.jit
def _persistent_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready,
                         k_empty, v_empty, works, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K,
                         n_qb, n_kb):
    ring = 0
    it = 0
    for w in range(gl.load(starts + gl.program_id(0)), gl.load(starts + gl.program_id(0) + 1)):
        q_row, row0, kv_row, n_full, first_full, n_tiles, part_list = _item(
            works, w, H, GROUP, N_Q, N_K, n_qb, full_cnt, full_start, part_cnt, part_idx, n_kb)
        qb = it % 2
        mbarrier.wait(q_empty.index(qb), ((it // 2) & 1) ^ 1)          # both consumers done with it
        _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars.index(qb), k_ready, v_ready, k_empty,
                  v_empty, q_row, 0, kv_row, 0, n_tiles, n_full, first_full, part_list, 2 * qb, ring)
        ring += n_tiles
        it += 1


@gluon.jit
def _persistent_consumer(O, LSE, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty, v_empty, row_lo,
                         row_hi, works, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb,
                         n_kb, qk_scale, WG: gl.constexpr):
    ring = 0
    it = 0
    for w in range(gl.load(starts + gl.program_id(0)), gl.load(starts + gl.program_id(0) + 1)):
        q_row, row0, kv_row, n_full, first_full, n_tiles, part_list = _item(
            works, w, H, GROUP, N_Q, N_K, n_qb, full_cnt, full_start, part_cnt, part_idx, n_kb)
        qb = it % 2
        _consumer(O, LSE, q_smem, k_smem, v_smem, q_bars.index(qb), k_ready, v_ready, k_empty, v_empty, row_lo,
                  row_hi, q_row, row0, n_tiles, n_full, first_full, part_list, N_Q, qk_scale, 0, 0, 0, 0, 0, WG,
                  False, 2 * qb, (it // 2) & 1, ring)
        mbarrier.arrive(q_empty.index(qb), count=1)
        ring += n_tiles
        it += 1


# a partition's constexprs are fixed in a wrapper (warp_specialize passes values only)
@gluon.jit
def _persistent_consumer0(O, LSE, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty, v_empty, row_lo,
                          row_hi, works, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb,
                          n_kb, qk_scale):
    _persistent_consumer(O, LSE, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty, v_empty, row_lo,
                         row_hi, works, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb,
                         n_kb, qk_scale, 0)


@gluon.jit
def _persistent_consumer1(O, LSE, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty, v_empty, row_lo,
                          row_hi, works, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb,
                          n_kb, qk_scale):
    _persistent_consumer(O, LSE, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty, v_empty, row_lo,
                         row_hi, works, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb,
                         n_kb, qk_scale, 1)


@gluon.jit(do_not_specialize=["H", "GROUP", "N_Q", "N_K", "n_qb", "n_kb"])
def attn_fwd_gluon_persistent_kernel(q_desc, k_desc, v_desc, O, LSE, row_lo, row_hi, full_cnt, full_start, part_cnt,
                                     part_idx, works, starts, H, GROUP, N_Q, N_K, n_qb, n_kb, qk_scale,
                                     STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr):
    """Program p runs the work items works[starts[p]:starts[p + 1]] in turn; the arguments as
    kernels.gluon_fwd_kernel.attn_fwd_gluon_kernel's (contiguous q, k, v), untraced."""
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = k_desc.block_type.shape[1]
    q_smem, q_bars, q_empty = two_items_q(q_desc)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    _, k_ready, v_ready, k_empty, v_empty = kv_ring_barriers(STAGES)
    consumer_args = (O, LSE, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty, v_empty, row_lo,
                     row_hi, works, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb, n_kb,
                     qk_scale)
    producer_args = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty,
                     v_empty, works, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb, n_kb)
    gl.warp_specialize([(_persistent_consumer0, consumer_args), (_persistent_consumer1, consumer_args),
                        (_persistent_producer, producer_args)], [4, 1], [CONSUMER_REGS, 24])


def gluon_fwd_persistent(q, k, v, mask: str = "causal", sm_scale=None, programs: int | None = None,
                         schedule: str = "natural", heads_per_group: int = 8):
    """The persistent probe on a call the product runs on the Gluon kernel.

    Arguments:
        q: (B, H, N_q, D); k, v: (B, H_kv, N_k, D); contiguous, bf16 or fp16, D 64 or 128, on a
            Hopper GPU (or the offline build's stand-in).
        mask: mask text; sm_scale: the softmax scale (None: 1/sqrt(D)).
        programs: how many programs (None: the GPU's SM count, at most the items).
        schedule: the work list's order, 'natural' or 'longest_first' (program p takes items p,
            p + G, ... of it), or 'lpt': each item, longest first, to the least loaded program,
            heads_per_group heads after heads_per_group heads (kernels.plan.program_lists).
    Returns:
        (O (B, H, N_q, D) like q, lse (B, H, N_q) float32), the product kernel's bit for bit."""
    from kernels.gluon_launch import CONSUMER_REGS, TILES, descriptor_on
    from kernels.launch import _qk_scale, resolve_launch
    from kernels.runtime import device_facts

    if schedule not in ("natural", "longest_first", "lpt"):
        raise ValueError(f"gluon_fwd_persistent: schedule is 'natural', 'longest_first' or 'lpt', not {schedule!r}")
    lp = resolve_launch(q, k, v, mask, None, None, "natural" if schedule == "lpt" else schedule, None, None, True,
                        None, None, None, None, False, False, "all")
    launch = lp.gluon
    if launch is None or launch.token_major or any(launch.copies) or q.shape[3] not in (64, 128):
        raise ValueError("gluon_fwd_persistent: takes contiguous q, k, v of D 64 or 128 where the product runs the "
                         "Gluon kernel (a Hopper GPU, bf16 / fp16, N_q and N_k >= 128)")
    b, h, n, d = q.shape
    plan, n_work = launch.plan, launch.works.numel()
    o = torch.empty_like(q)                                                # (B, H, N_q, D)
    lse = torch.empty((b, h, n), dtype=torch.float32, device=q.device)    # (B, H, N_q)
    q_desc, kv_desc = launch.descriptors
    grid = (min(programs or device_facts(q.device).sm_count, n_work),)
    works, starts = plan.program_work(b * h, grid[0], schedule, ITEM_COST, heads_per_group)   # (n_work,), (G + 1,)
    attn_fwd_gluon_persistent_kernel[grid](
        descriptor_on(q_desc, q), descriptor_on(kv_desc, k), descriptor_on(kv_desc, v), o, lse, plan.row_lo, plan.row_hi, plan.full_cnt,
        plan.full_start, plan.part_cnt, plan.part_idx, works, starts, h, h // k.shape[1], n, k.shape[2],
        plan.n_qb, plan.n_kb, _qk_scale(lp, sm_scale), TILES[d][1], CONSUMER_REGS, num_warps=4)
    return o, lse
