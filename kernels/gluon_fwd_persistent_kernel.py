"""The Gluon forward as a persistent kernel (what kernels.gluon_launch runs for schedule="persistent"
on Hopper, contiguous q, k, v of D 64 or 128): one program per SM walks its own list of work
items, dealt on the host longest first to the least loaded program a few heads at a time
(kernels.plan.BlockPlan.program_work, 'lpt').

Each item runs kernels.gluon_fwd_kernel's partitions' code (`_producer`, `_consumer` at a Q slot
and ring position), so O and lse are the one-program-per-item kernel's bit for bit; the producer
loads the next item's Q into the second of two Q buffers (D 256's do not fit shared memory) and
its K / V tiles into the same ring while the consumers finish the item before.

Traced as kernels.gluon_fp8_persistent_kernel: an item's record is written by the first consumer
group (its program, then its start, SM and end around that group's part of the item); its order
field is left at -1 and the host orders items by their start (instrumentation.recording.raw_trace).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from .gluon_fwd_kernel import (_consumer, _globaltimer, _producer, block_lists, kv_ring, kv_ring_barriers,
                               persistent_trace_buffers, record_work_end, trace_pointers, two_items_q, work_item)


@gluon.jit
def _item(items, i, H, GROUP, N_Q, N_K, n_qb, full_cnt, full_start, part_cnt, part_idx, n_kb):
    """The program's i-th place in items: (the work item, bh, query block, its Q rows (head-major),
    first query row in its head, K / V rows, full count, first full block, tiles, partial list)."""
    w = gl.load(items + i)
    bh, q_block, bh_kv, row0 = work_item(w, H, GROUP, n_qb)
    n_full, first_full, n_tiles, part_list = block_lists(q_block, full_cnt, full_start, part_cnt, part_idx, n_kb)
    return w, bh, q_block, bh * N_Q + row0, row0, bh_kv * N_K, n_full, first_full, n_tiles, part_list


@gluon.jit
def _items_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty,
                    v_empty, items, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb, n_kb):
    """The program's items in turn: Q into the free one of two Q buffers (once both consumers are
    done with the item two before), then its K / V tiles on into the ring."""
    ring = 0
    it = 0
    for i in range(gl.load(starts + gl.program_id(0)), gl.load(starts + gl.program_id(0) + 1)):
        w, bh, q_block, q_row, row0, kv_row, n_full, first_full, n_tiles, part_list = _item(
            items, i, H, GROUP, N_Q, N_K, n_qb, full_cnt, full_start, part_cnt, part_idx, n_kb)
        qb = it % 2
        mbarrier.wait(q_empty.index(qb), ((it // 2) & 1) ^ 1)
        _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars.index(qb), k_ready, v_ready, k_empty,
                  v_empty, q_row, 0, kv_row, 0, n_tiles, n_full, first_full, part_list, 2 * qb, ring)
        ring += n_tiles
        it += 1


@gluon.jit
def _items_consumer(O, LSE, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty, v_empty, row_lo,
                    row_hi, items, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb, n_kb,
                    qk_scale, tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots, WG: gl.constexpr,
                    TRACE_WORK: gl.constexpr, TRACE_TILES: gl.constexpr):
    """One consumer group's part of the program's items in turn; with TRACE_WORK group 0 writes
    each item's work record, with TRACE_TILES both write its tiles and rows where traced."""
    ring = 0
    it = 0
    pid = gl.program_id(0)
    for i in range(gl.load(starts + pid), gl.load(starts + pid + 1)):
        w, bh, q_block, q_row, row0, kv_row, n_full, first_full, n_tiles, part_list = _item(
            items, i, H, GROUP, N_Q, N_K, n_qb, full_cnt, full_start, part_cnt, part_idx, n_kb)
        qb = it % 2
        if TRACE_WORK and WG == 0:
            rec = tr_work + w.to(gl.int64) * 5
            gl.store(rec, pid.to(gl.int64))
            gl.store(rec + 3, _globaltimer())
        if TRACE_TILES:
            tiles_ptr, rows_ptr, tr_n_kb, tiles_on, rows_on = trace_pointers(tr_tiles, tr_rows, row_slot, head_slot,
                                                                             trace_slots, bh, q_block, n_qb, n_kb)
        else:
            tiles_ptr, rows_ptr, tr_n_kb, tiles_on, rows_on = 0, 0, 0, 0, 0
        _consumer(O, LSE, q_smem, k_smem, v_smem, q_bars.index(qb), k_ready, v_ready, k_empty, v_empty, row_lo,
                  row_hi, q_row, row0, n_tiles, n_full, first_full, part_list, N_Q, qk_scale, tiles_ptr, rows_ptr,
                  tr_n_kb, tiles_on, rows_on, WG, TRACE_TILES, 2 * qb, (it // 2) & 1, ring)
        mbarrier.arrive(q_empty.index(qb), count=1)
        if TRACE_WORK and WG == 0:
            record_work_end(tr_work, w)
        ring += n_tiles
        it += 1


# the five consumers: a partition's constexprs are fixed here (warp_specialize passes values only)
@gluon.jit
def _consumer0(O, LSE, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty, v_empty, row_lo, row_hi,
               items, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb, n_kb, qk_scale,
               tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots):
    _items_consumer(O, LSE, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty, v_empty, row_lo,
                    row_hi, items, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb, n_kb,
                    qk_scale, tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots, 0, False, False)


@gluon.jit
def _consumer1(O, LSE, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty, v_empty, row_lo, row_hi,
               items, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb, n_kb, qk_scale,
               tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots):
    _items_consumer(O, LSE, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty, v_empty, row_lo,
                    row_hi, items, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb, n_kb,
                    qk_scale, tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots, 1, False, False)


@gluon.jit
def _consumer0_work(O, LSE, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty, v_empty, row_lo,
                    row_hi, items, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb, n_kb,
                    qk_scale, tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots):
    _items_consumer(O, LSE, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty, v_empty, row_lo,
                    row_hi, items, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb, n_kb,
                    qk_scale, tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots, 0, True, False)


@gluon.jit
def _consumer0_tiles(O, LSE, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty, v_empty, row_lo,
                     row_hi, items, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb, n_kb,
                     qk_scale, tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots):
    _items_consumer(O, LSE, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty, v_empty, row_lo,
                    row_hi, items, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb, n_kb,
                    qk_scale, tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots, 0, True, True)


@gluon.jit
def _consumer1_tiles(O, LSE, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty, v_empty, row_lo,
                     row_hi, items, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb, n_kb,
                     qk_scale, tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots):
    _items_consumer(O, LSE, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty, v_empty, row_lo,
                    row_hi, items, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb, n_kb,
                    qk_scale, tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots, 1, True, True)


@gluon.jit(do_not_specialize=["H", "GROUP", "N_Q", "N_K", "n_qb", "n_kb"])
def attn_fwd_gluon_persistent_kernel(q_desc, k_desc, v_desc, O, LSE, row_lo, row_hi, full_cnt, full_start, part_cnt,
                                     part_idx, items, starts, tr_work, tr_tiles, tr_rows, row_slot, head_slot,
                                     trace_slots, H, GROUP, N_Q, N_K, n_qb, n_kb, qk_scale, STAGES: gl.constexpr,
                                     CONSUMER_REGS: gl.constexpr, TRACE_WORK: gl.constexpr,
                                     TRACE_TILES: gl.constexpr):
    """Grid (programs,): program p runs the work items items[starts[p]:starts[p + 1]] (int32, each
    item once over all programs) in turn. TRACE_WORK: each item's program, SM and globaltimer span;
    TRACE_TILES (with the work records): each traced head's tiles and its traced query blocks' rows.
    The other arguments as kernels.gluon_fwd_kernel.attn_fwd_gluon_kernel's (contiguous q, k, v)."""
    q_smem, q_bars, q_empty = two_items_q(q_desc)
    k_smem, v_smem = kv_ring(k_desc, v_desc, STAGES)
    _, k_ready, v_ready, k_empty, v_empty = kv_ring_barriers(STAGES)
    lists = (items, starts, full_cnt, full_start, part_cnt, part_idx, H, GROUP, N_Q, N_K, n_qb, n_kb)
    traced = persistent_trace_buffers(tr_work, tr_tiles, tr_rows, row_slot, head_slot, trace_slots, H, TRACE_WORK,
                                      TRACE_TILES)
    consumers = (O, LSE, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty, v_empty, row_lo,
                 row_hi) + lists + (qk_scale, ) + traced
    producer = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty,
                v_empty) + lists
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
