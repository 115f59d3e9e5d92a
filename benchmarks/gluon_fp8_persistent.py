"""A probe, not a product path: the Gluon FP8 forward (kernels.gluon_fp8_kernel) as a persistent
kernel. One program per SM walks its list of work items (natural order: p, p + G, p + 2G, ... of
G programs); its producer loads the next item's Q into the second of two Q buffers and its K / V
tiles into the same ring while the consumers finish the item before, where the product starts
every item cold: a program launched, its barriers set up, Q loaded from memory
(scripts/fp8_item_floor.py: about 5 µs of an SM per item at D 128 with no tile at all, H200).

Each item runs the product kernel's partitions' code (`_producer`, `_consumer` at a Q slot and
ring position; the product's sm_90 SASS is byte for byte what it was), so O and lse equal the
product kernel's bit for bit. Two options the product does not take: tile 0's scores issued at
once rather than in turn (FlashAttention-3's order), and the items dealt longest first to the
least loaded program (kernels.plan.program_lists) rather than in natural order. Untraced;
padded D 128 (two Q buffers); the default options of GLUON_FP8. Timed against the product kernel
by `python -m benchmarks.gluon_fp8_persistent OUT.json`.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from kernels.gluon_fp8_kernel import _consumer, _producer, sum_ones
from benchmarks.gluon_fwd_persistent import two_items_q
from kernels.gluon_fwd_kernel import ROWS, kv_ring_barriers, work_item

ITEM_COST = 6.0     # an FP8 work item's cost beyond its tiles, in tiles (item-cost-nvidia-h200.json: 6.5 µs / 1.09 µs)

@gluon.jit
def _persistent_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty,
                         v_empty, full_cnt, full_start, part_cnt, part_idx, starts, H, GROUP, items, n_qb, n_kb):
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    ring = 0
    it = 0
    for i in range(gl.load(starts + gl.program_id(0)), gl.load(starts + gl.program_id(0) + 1)):
        w = gl.load(items + i)                                  # the program's next work item
        bh, q_block, kv_bh, row0 = work_item(w, H, GROUP, n_qb)
        qb = it % 2
        mbarrier.wait(q_empty.index(qb), ((it // 2) & 1) ^ 1)          # both consumers done with it
        ring += _producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars.index(qb), k_ready, v_ready, k_empty,
                          v_empty, w * (2 * ROWS), kv_bh * n_kb * BLOCK_N, kv_bh * HEAD_DIM, q_block, full_cnt,
                          full_start, part_cnt, part_idx, n_kb, 2 * qb, ring)
        it += 1


@gluon.jit
def _persistent_consumer(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bars, q_empty, k_ready,
                         v_ready, k_empty, v_empty, row_lo, row_hi, full_cnt, full_start, part_cnt, part_idx, starts,
                         H, GROUP, items, N_Q, n_qb, n_kb, D, qk_scale, done, RELABEL, PINGPONG, SERIAL, GATE_FIRST,
                         WG: gl.constexpr):
    ring = 0
    it = 0
    for i in range(gl.load(starts + gl.program_id(0)), gl.load(starts + gl.program_id(0) + 1)):
        w = gl.load(items + i)
        bh, q_block, kv_bh, row0 = work_item(w, H, GROUP, n_qb)
        qb = it % 2
        ring += _consumer(O, LSE, q_scale + w, k_scale + kv_bh * n_kb, v_scale + kv_bh * n_kb, q_smem, k_smem, v_smem,
                          ones, q_bars.index(qb), k_ready, v_ready, k_empty, v_empty, row_lo, row_hi, bh * N_Q + row0,
                          row0, q_block, full_cnt, full_start, part_cnt, part_idx, n_kb, N_Q, D, qk_scale, done,
                          RELABEL, PINGPONG, SERIAL, (0, 0, 0, 0, 0), WG, False, 2 * qb, (it // 2) & 1, ring,
                          GATE_FIRST)
        mbarrier.arrive(q_empty.index(qb), count=1)
        it += 1


# a partition's constexprs are fixed in a wrapper (warp_specialize passes values only)
@gluon.jit
def _persistent_consumer0(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bars, q_empty, k_ready,
                          v_ready, k_empty, v_empty, row_lo, row_hi, full_cnt, full_start, part_cnt, part_idx, starts,
                          H, GROUP, items, N_Q, n_qb, n_kb, D, qk_scale, done, RELABEL, PINGPONG, SERIAL, GATE_FIRST):
    _persistent_consumer(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bars, q_empty, k_ready,
                         v_ready, k_empty, v_empty, row_lo, row_hi, full_cnt, full_start, part_cnt, part_idx, starts,
                         H, GROUP, items, N_Q, n_qb, n_kb, D, qk_scale, done, RELABEL, PINGPONG, SERIAL, GATE_FIRST,
                         0)


@gluon.jit
def _persistent_consumer1(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bars, q_empty, k_ready,
                          v_ready, k_empty, v_empty, row_lo, row_hi, full_cnt, full_start, part_cnt, part_idx, starts,
                          H, GROUP, items, N_Q, n_qb, n_kb, D, qk_scale, done, RELABEL, PINGPONG, SERIAL, GATE_FIRST):
    _persistent_consumer(O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bars, q_empty, k_ready,
                         v_ready, k_empty, v_empty, row_lo, row_hi, full_cnt, full_start, part_cnt, part_idx, starts,
                         H, GROUP, items, N_Q, n_qb, n_kb, D, qk_scale, done, RELABEL, PINGPONG, SERIAL, GATE_FIRST,
                         1)


@gluon.jit(do_not_specialize=["H", "GROUP", "N_Q", "n_qb", "n_kb"])
def attn_fwd_fp8_gluon_persistent_kernel(q_desc, k_desc, v_desc, O, LSE, q_scale, k_scale, v_scale, row_lo, row_hi,
                                         full_cnt, full_start, part_cnt, part_idx, items, starts, H, GROUP, N_Q, n_qb,
                                         n_kb, qk_scale, D: gl.constexpr, STAGES: gl.constexpr,
                                         CONSUMER_REGS: gl.constexpr, RELABEL: gl.constexpr,
                                         PINGPONG: gl.constexpr, SERIAL: gl.constexpr, MMA_SUM: gl.constexpr,
                                         GATE_FIRST: gl.constexpr):
    """Program p runs the work items items[starts[p]:starts[p + 1]] (int32, every item once over the
    programs) in turn; GATE_FIRST: as kernels.gluon_fp8_kernel._consumer's;
    the other arguments as kernels.gluon_fp8_kernel.attn_fwd_fp8_gluon_kernel's, untraced."""
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    HEAD_DIM: gl.constexpr = k_desc.block_type.shape[1]
    q_smem, q_bars, q_empty = two_items_q(q_desc)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, HEAD_DIM, BLOCK_N], v_desc.layout)
    _, k_ready, v_ready, k_empty, v_empty = kv_ring_barriers(STAGES)
    done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())     # (the product's; unread here)
    mbarrier.init(done, count=2)
    ones = sum_ones(BLOCK_N, MMA_SUM)
    lists = (full_cnt, full_start, part_cnt, part_idx, starts, H, GROUP, items)
    consumer_args = (O, LSE, q_scale, k_scale, v_scale, q_smem, k_smem, v_smem, ones, q_bars, q_empty, k_ready,
                     v_ready, k_empty, v_empty, row_lo, row_hi) + lists + (N_Q, n_qb, n_kb, D, qk_scale, done,
                                                                            RELABEL, PINGPONG, SERIAL, GATE_FIRST)
    producer_args = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, q_empty, k_ready, v_ready, k_empty,
                     v_empty) + lists + (n_qb, n_kb)
    gl.warp_specialize([(_persistent_consumer0, consumer_args), (_persistent_consumer1, consumer_args),
                        (_persistent_producer, producer_args)], [4, 1], [CONSUMER_REGS, 24])


def gluon_fp8_persistent(x, mask: str = "causal", sm_scale=None, programs: int | None = None, *,
                         gate_first: bool = True, order: str = "natural", heads_per_group: int | None = None):
    """The persistent probe on inputs quantised for the Gluon FP8 kernel.

    Arguments:
        x: kernels.fp8_quant.quantize_fp8's Fp8Inputs with x.gluon (a Hopper GPU, padded D 128).
        mask: mask text; sm_scale: the softmax scale (None: 1/sqrt(D)).
        programs: how many programs (None: the GPU's SM count, at most the items).
        gate_first: tile 0's scores issued in turn (the product's way), else at once.
        order: "natural" (program p takes items p, p + programs, ...) or "lpt"
            (kernels.plan.program_lists).
        heads_per_group: with "lpt", the heads dealt together (None: all of them).
    Returns:
        (O (B, H, N_q, D) in x's dtype, lse (B, H, N_q) float32), the product kernel's bit for bit."""
    return persistent_call(x, mask, sm_scale, programs, gate_first=gate_first, order=order,
                           heads_per_group=heads_per_group)()


def persistent_call(x, mask: str = "causal", sm_scale=None, programs: int | None = None, *, gate_first: bool = True,
                    order: str = "natural", heads_per_group: int | None = None):
    """gluon_fp8_persistent's launch with everything but the launch done once: a function of no
    arguments that launches it and returns (O, lse), so that timing it times the GPU, not the host."""
    from kernels.gluon_fp8_launch import GluonFp8Plan
    from kernels.gluon_launch import CONSUMER_REGS, descriptor_on
    from kernels.launch import LOG2E
    from kernels.masks import parse_mask
    from kernels.runtime import device_facts
    from kernels.shapes import softmax_scale

    if not x.gluon or x.head_dim_padded != 128:
        raise ValueError("gluon_fp8_persistent: takes inputs quantised for the Gluon FP8 kernel at a padded D of 128")
    if order not in ("natural", "lpt"):
        raise ValueError(f"gluon_fp8_persistent: order is 'natural' or 'lpt', not {order!r}")
    b, h, n_q, d = x.shape
    fp = GluonFp8Plan.build(x, parse_mask(mask, n_q, x.n_k))
    plan, n_work = fp.plan, b * h * fp.plan.n_qb
    grid = (min(programs or device_facts(x.q.device).sm_count, n_work),)
    items, starts = plan.program_work(b * h, grid[0], order, ITEM_COST, heads_per_group)     # (n_work,), (G + 1,)
    o = torch.empty(x.shape, dtype=x.dtype, device=x.q.device)                 # (B, H, N_q, D)
    lse = torch.empty((b, h, n_q), dtype=torch.float32, device=x.q.device)    # (B, H, N_q)
    q_desc, k_desc, v_desc = fp.descriptors
    args = (descriptor_on(q_desc, x.q), descriptor_on(k_desc, x.k), descriptor_on(v_desc, x.v), o, lse, x.q_scale,
            x.k_scale, x.v_scale, plan.row_lo, plan.row_hi, plan.full_cnt, plan.full_start, plan.part_cnt,
            plan.part_idx, items, starts, h, h // x.h_kv, n_q, plan.n_qb, plan.n_kb,
            softmax_scale(sm_scale, d) * LOG2E, d, fp.stages, CONSUMER_REGS, x.key_order, fp.pingpong, fp.serial,
            fp.mma_sum, gate_first)

    def launch():
        attn_fwd_fp8_gluon_persistent_kernel[grid](*args, num_warps=4)
        return o, lse
    return launch


CASES = ((4, 16, 16, 4096, "full"), (4, 16, 16, 8192, "full"), (4, 16, 16, 16384, "full"),
         (4, 16, 16, 4096, "causal"), (4, 16, 16, 8192, "causal"), (4, 16, 16, 16384, "causal"),
         (2, 32, 8, 8192, "causal"))
# the probe's variants: (gate_first, order, heads_per_group)
VARIANTS = {"persistent": (True, "natural", None), "persistent, tile 0 at once": (False, "natural", None),
            "persistent, lpt by 8 heads": (True, "lpt", 8),
            "persistent, tile 0 at once, lpt by 4 heads": (False, "lpt", 4),
            "persistent, tile 0 at once, lpt by 8 heads": (False, "lpt", 8),
            "persistent, tile 0 at once, lpt by 16 heads": (False, "lpt", 16)}


def main(argv=None) -> int:
    """Each case: every variant of the probe checked bit for bit against the product kernel
    (kernels.fp8.attention_fp8 on the same quantised inputs), then all timed in turn
    (instrumentation.recording.timing.time_ms, (product, variants...) x 3, the middle of each
    three); writes OUT.json (device, versions, commit, per case each one's time and its speed over
    the product's)."""
    from instrumentation.recording.environment import environment
    from instrumentation.recording.timing import time_ms
    from kernels.fp8 import attention_fp8
    from kernels.fp8_quant import quantize_fp8

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m benchmarks.gluon_fp8_persistent OUT.json", file=sys.stderr)
        return 2
    records = []
    for b, h, h_kv, n, mask in CASES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, h, n, 128, device="cuda", dtype=torch.bfloat16, generator=g)          # (B, H, N, D)
        k, v = (torch.randn(b, h_kv, n, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        x = quantize_fp8(q, k, v, mask=mask)
        if not x.gluon:
            print("the product does not run the Gluon FP8 kernel here (a Hopper GPU with Gluon)", file=sys.stderr)
            return 2
        want, want_lse = attention_fp8(x, mask, return_lse=True)
        calls = {"product": lambda: attention_fp8(x, mask)}
        calls.update({name: persistent_call(x, mask, gate_first=gate, order=order, heads_per_group=group)
                      for name, (gate, order, group) in VARIANTS.items()})
        same = all(torch.equal(o, want) and torch.equal(lse, want_lse)
                   for o, lse in (calls[name]() for name in VARIANTS))
        times = {name: [] for name in calls}
        for _ in range(3):
            for name, call in calls.items():
                times[name].append(time_ms(call))
        ms = {name: sorted(t)[1] for name, t in times.items()}
        rec = dict(case=f"B{b} H{h}/{h_kv} N{n} D128 {mask}", bit_identical=same, product_ms=ms["product"],
                   persistent_ms=ms["persistent"], speed_persistent_over_product=ms["product"] / ms["persistent"],
                   variants={name: dict(ms=ms[name], speed_over_product=ms["product"] / ms[name]) for name in VARIANTS})
        records.append(rec)
        print(json.dumps(rec), flush=True)
    meta = dict(environment(torch.device("cuda")), commit=os.environ.get("TILESCOPE_COMMIT"),
                command="python -m benchmarks.gluon_fp8_persistent OUT.json")
    with open(args[0], "w") as f:
        json.dump(dict(meta=meta, records=records), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
