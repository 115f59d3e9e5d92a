"""The Gluon FP8 forward as a persistent kernel (what kernels.gluon_fp8_launch runs at a padded D
of 128 and 256): one program per SM walks its own list of work items, dealt on the host longest
first to the least loaded program a few heads at a time (kernels.plan.BlockPlan.program_work,
'lpt').

Each item runs kernels.gluon_fp8_kernel's partitions' code (`_producer`, `_consumer` at a Q slot
and ring position), so O and lse are the one-program-per-item kernel's bit for bit. What the
persistence buys: the producer loads the next item's Q into the second of two Q buffers and its
K / V tiles into the same ring while the consumers finish the item before, where a program per
item starts every item cold (a launch, its barriers set up, Q from memory: about 5 µs of an SM
per item at D 128, scripts/fp8_item_floor.py); and tile 0's scores are issued at once, not in
turn (FlashAttention-3's order; in turn it cost a persistent program 3-4 %,
gluon-fp8-persistent-nvidia-h200.json).

Traced as the other kernel, but a work item's record is written by the first consumer group, not
the producer (which runs an item ahead): its program, then its start, SM and end around that
group's part of the item. Its order field is left at -1: the host orders items by their start
(instrumentation.recording.raw_trace).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from .gluon_fp8_kernel import _consumer, _producer, sum_ones
from .gluon_fwd_kernel import (ROWS, _globaltimer, kv_ring, kv_ring_barriers, persistent_trace_buffers, record_work_end,
                               trace_pointers, two_items_q, work_item)


@gluon.jit
def _items_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty,
                    v_empty, full_cnt, full_start, part_cnt, part_idx, items, starts, H, GROUP, n_qb, n_kb):
    """The program's items in turn: Q into the free one of two Q buffers (once both consumers
    are done with the item two before), then its K / V tiles on into the ring."""
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    ring = 0
    it = 0
    for i in range(gl.load(starts + gl.program_id(0)), gl.load(starts + gl.program_id(0) + 1)):
        w = gl.load(items + i)
        bh, q_block, kv_bh, row0 = work_item(w, H, GROUP, n_qb)
        qb = it % 2
        mbarrier.wait(q_empty.index(qb), ((it // 2) & 1) ^ 1)
        ring += _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars.index(qb), k_ready, v_ready, k_empty,
                          v_empty, w * (2 * ROWS), kv_bh * n_kb * BLOCK_N, kv_bh * HEAD_DIM, q_block, full_cnt,
                          full_start, part_cnt, part_idx, n_kb, 2 * qb, ring)
        it += 1


@gluon.jit
def _items_consumer(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bars, q_empty, k_ready,
                    v_ready, k_empty, v_empty, row_lo, row_hi, full_cnt, full_start, part_cnt, part_idx, items, starts,
                    H, GROUP, N_Q, n_qb, n_kb, D, qk_scale, done, RELABEL, PINGPONG, SERIAL, tr_work, tr_tiles,
                    tr_rows, row_slot, head_slot, trace_slots, WG: gl.constexpr, TRACE_WORK: gl.constexpr,
                    TRACE_TILES: gl.constexpr):
    """One consumer group's part of the program's items in turn; with TRACE_WORK group 0 writes
    each item's work record, with TRACE_TILES both write its tiles and rows where traced."""
    ring = 0
    it = 0
    pid = gl.program_id(0)
    for i in range(gl.load(starts + pid), gl.load(starts + pid + 1)):
        w = gl.load(items + i)
        bh, q_block, kv_bh, row0 = work_item(w, H, GROUP, n_qb)
        qb = it % 2
        if TRACE_WORK and WG == 0:
            rec = tr_work + w.to(gl.int64) * 5
            gl.store(rec, pid.to(gl.int64))
            gl.store(rec + 3, _globaltimer())
        if TRACE_TILES:
            trace = trace_pointers(tr_tiles, tr_rows, row_slot, head_slot, trace_slots, bh, q_block, n_qb, n_kb)
        else:
            trace = (0, 0, 0, 0, 0)
        ring += _consumer(O, LSE, q_scale + w, k_scale + kv_bh * n_kb, v_scale + kv_bh * n_kb, q_smem, k_smem, v_smem,
                          ones, q_bars.index(qb), k_ready, v_ready, k_empty, v_empty, row_lo, row_hi, bh * N_Q + row0,
                          row0, q_block, full_cnt, full_start, part_cnt, part_idx, n_kb, N_Q, D, qk_scale, done,
                          RELABEL, PINGPONG, SERIAL, trace, WG, TRACE_TILES, 2 * qb, (it // 2) & 1, ring, False)
        mbarrier.arrive(q_empty.index(qb), count=1)
        if TRACE_WORK and WG == 0:
            record_work_end(tr_work, w)
        it += 1


# the six consumers: a partition's constexprs are fixed here (warp_specialize passes values only)
@gluon.jit
def _consumer0(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bars, q_empty, k_ready, v_ready,
               k_empty, v_empty, row_lo, row_hi, full_cnt, full_start, part_cnt, part_idx, items, starts, H, GROUP,
               N_Q, n_qb, n_kb, D, qk_scale, done, RELABEL, PINGPONG, SERIAL, tr_work, tr_tiles, tr_rows, row_slot,
               head_slot, trace_slots):
    _items_consumer(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bars, q_empty, k_ready,
                    v_ready, k_empty, v_empty, row_lo, row_hi, full_cnt, full_start, part_cnt, part_idx, items,
                    starts, H, GROUP, N_Q, n_qb, n_kb, D, qk_scale, done, RELABEL, PINGPONG, SERIAL, tr_work,
                    tr_tiles, tr_rows, row_slot, head_slot, trace_slots, 0, False, False)


@gluon.jit
def _consumer1(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bars, q_empty, k_ready, v_ready,
               k_empty, v_empty, row_lo, row_hi, full_cnt, full_start, part_cnt, part_idx, items, starts, H, GROUP,
               N_Q, n_qb, n_kb, D, qk_scale, done, RELABEL, PINGPONG, SERIAL, tr_work, tr_tiles, tr_rows, row_slot,
               head_slot, trace_slots):
    _items_consumer(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bars, q_empty, k_ready,
                    v_ready, k_empty, v_empty, row_lo, row_hi, full_cnt, full_start, part_cnt, part_idx, items,
                    starts, H, GROUP, N_Q, n_qb, n_kb, D, qk_scale, done, RELABEL, PINGPONG, SERIAL, tr_work,
                    tr_tiles, tr_rows, row_slot, head_slot, trace_slots, 1, False, False)


@gluon.jit
def _consumer0_work(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bars, q_empty, k_ready,
                    v_ready, k_empty, v_empty, row_lo, row_hi, full_cnt, full_start, part_cnt, part_idx, items, starts,
                    H, GROUP, N_Q, n_qb, n_kb, D, qk_scale, done, RELABEL, PINGPONG, SERIAL, tr_work, tr_tiles,
                    tr_rows, row_slot, head_slot, trace_slots):
    _items_consumer(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bars, q_empty, k_ready,
                    v_ready, k_empty, v_empty, row_lo, row_hi, full_cnt, full_start, part_cnt, part_idx, items,
                    starts, H, GROUP, N_Q, n_qb, n_kb, D, qk_scale, done, RELABEL, PINGPONG, SERIAL, tr_work,
                    tr_tiles, tr_rows, row_slot, head_slot, trace_slots, 0, True, False)


@gluon.jit
def _consumer0_tiles(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bars, q_empty, k_ready,
                     v_ready, k_empty, v_empty, row_lo, row_hi, full_cnt, full_start, part_cnt, part_idx, items,
                     starts, H, GROUP, N_Q, n_qb, n_kb, D, qk_scale, done, RELABEL, PINGPONG, SERIAL, tr_work, tr_tiles,
                     tr_rows, row_slot, head_slot, trace_slots):
    _items_consumer(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bars, q_empty, k_ready,
                    v_ready, k_empty, v_empty, row_lo, row_hi, full_cnt, full_start, part_cnt, part_idx, items,
                    starts, H, GROUP, N_Q, n_qb, n_kb, D, qk_scale, done, RELABEL, PINGPONG, SERIAL, tr_work,
                    tr_tiles, tr_rows, row_slot, head_slot, trace_slots, 0, True, True)


@gluon.jit
def _consumer1_tiles(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bars, q_empty, k_ready,
                     v_ready, k_empty, v_empty, row_lo, row_hi, full_cnt, full_start, part_cnt, part_idx, items,
                     starts, H, GROUP, N_Q, n_qb, n_kb, D, qk_scale, done, RELABEL, PINGPONG, SERIAL, tr_work, tr_tiles,
                     tr_rows, row_slot, head_slot, trace_slots):
    _items_consumer(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bars, q_empty, k_ready,
                    v_ready, k_empty, v_empty, row_lo, row_hi, full_cnt, full_start, part_cnt, part_idx, items,
                    starts, H, GROUP, N_Q, n_qb, n_kb, D, qk_scale, done, RELABEL, PINGPONG, SERIAL, tr_work,
                    tr_tiles, tr_rows, row_slot, head_slot, trace_slots, 1, True, True)


@gluon.jit(do_not_specialize=["H", "GROUP", "N_Q", "n_qb", "n_kb"])
def attn_fwd_fp8_gluon_persistent_kernel(q_desc, k_desc, v_desc, O, LSE, q_scale, k_scale, v_scale, row_lo, row_hi,
                                         full_cnt, full_start, part_cnt, part_idx, items, starts, tr_work, tr_tiles,
                                         tr_rows, row_slot, head_slot, trace_slots, H, GROUP, N_Q, n_qb, n_kb,
                                         qk_scale, D: gl.constexpr, STAGES: gl.constexpr,
                                         CONSUMER_REGS: gl.constexpr, RELABEL: gl.constexpr,
                                         PINGPONG: gl.constexpr, SERIAL: gl.constexpr, MMA_SUM: gl.constexpr,
                                         TRACE_WORK: gl.constexpr, TRACE_TILES: gl.constexpr):
    """Grid (programs,): program p runs the work items items[starts[p]:starts[p + 1]] (int32, each
    item once over all programs) in turn. TRACE_WORK: each item's program, SM and globaltimer
    span; TRACE_TILES (with the work records): each traced head's tiles and its traced query
    blocks' rows. The other arguments as kernels.gluon_fp8_kernel.attn_fwd_fp8_gluon_kernel's."""
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    q_smem, q_bars, q_empty = two_items_q(q_desc)
    k_smem, v_smem = kv_ring(k_desc, v_desc, STAGES)
    _, k_ready, v_ready, k_empty, v_empty = kv_ring_barriers(STAGES)
    done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())     # (each item arrives; unread)
    mbarrier.init(done, count=2)
    ones = sum_ones(BLOCK_N, MMA_SUM)
    lists = (full_cnt, full_start, part_cnt, part_idx, items, starts, H, GROUP)
    traced = persistent_trace_buffers(tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots, H, TRACE_WORK,
                                      TRACE_TILES)
    consumers = (O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bars, q_empty, k_ready, v_ready,
                 k_empty, v_empty, row_lo, row_hi) + lists + (N_Q, n_qb, n_kb, D, qk_scale, done, RELABEL, PINGPONG,
                                                              SERIAL) + traced
    producer = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty,
                v_empty) + lists + (n_qb, n_kb)
    # (a partition is a literal function here: warp_specialize takes no function held in a variable)
    if TRACE_TILES:
        gl.warp_specialize([(_consumer0_tiles, consumers), (_consumer1_tiles, consumers),
                            (_items_producer, producer)], [4, 1], [CONSUMER_REGS, 24])
    elif TRACE_WORK:    # group 1 untraced: its code is the untraced kernel's
        gl.warp_specialize([(_consumer0_work, consumers), (_consumer1, consumers), (_items_producer, producer)],
                           [4, 1], [CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([(_consumer0, consumers), (_consumer1, consumers), (_items_producer, producer)], [4, 1],
                           [CONSUMER_REGS, 24])
