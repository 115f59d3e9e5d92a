"""Host side of split-KV decoding (FlashDecoding): checks, the split rule, the launches.

    o = flash_decode(q, k_cache, v_cache, cache_seqlens=None, num_splits="auto")
    # q (B, H, N_q, D), N_q 1..16; k_cache, v_cache (B, H_kv, N_max, D), H % H_kv == 0
    # cache_seqlens (B,) int32 valid lengths; query t of sequence b sits at key position
    # cache_seqlens[b] - N_q + t and sees keys j <= that position (bottom-right causal)
    o = flash_decode(q, k_pages, v_pages, cache_seqlens, block_table=block_table)
    # paged (flash-attention's layout): k_pages, v_pages (num_blocks, page_size, H_kv, D),
    # block_table (B, max_blocks) int32; key j of sequence b is row j % page_size of page
    # block_table[b, j // page_size]; N_max = max_blocks * page_size (kernels.paged)

Where to read: this module holds the plan (DecodePlan: shapes, tiles, the split count), the split
rule, the trace buffers, `flash_decode` and the custom op `tilescope::flash_decode` it calls
(registered when this module is first imported; torch.compile sees one opaque node, a CUDA graph
captures it); kernels.decode_launch allocates a planned call's outputs (`run_plan`), turns the
plan and tensors into the kernels' arguments (one mapping keyed by parameter name, the constexpr
groups TILE / CACHE / MERGE / TRACE) and launches them; kernels.decode_kernel holds the two
kernels; kernels.decode_inputs the input rules.

What is checked where: shapes, dtypes, devices and settings of every argument on the host, before
any launch (kernels.decode_inputs.check_decode_inputs, no host read of tensor contents); the
values of cache_seqlens and block_table in the kernel (validate=False, the default: a bad length or
table entry is never dereferenced and gives that sequence NaN rows), or on the host with
validate=True (one-line refusals, a synchronisation). Plans are cached by shapes and settings:
"auto" splits come from the cache's capacity N_max (max_blocks * page_size), never the lengths.

The split rule ("auto") fills the GPU with one wave of programs when the work items are few, and
is FlashAttention-2's `num_splits_heuristic` (flash_api.cpp) otherwise; see `choose_num_splits`.
The merge of the splits runs inside stage 1 (the last split program of each group to finish
merges it; `fused_merge=False` launches it as a second kernel instead, as FlashAttention does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Optional

import torch

from .runtime import choose_backend, device_facts
from .sizes import BLOCK_SIZES

choose_backend()  # before triton is imported: the interpreter is chosen at import time

import triton  # noqa: E402

# merge_counters is re-exported: callers and tests read the counters a call used
from .decode_launch import launch, launch_args, merge_counters, run_plan  # noqa: E402,F401
from .outside_graph import outside_graph  # noqa: E402
from .shapes import padded_head_dim  # noqa: E402

# the input rules live in kernels.decode_inputs; re-exported here, where callers have read them
from .decode_inputs import (GRAD_REFUSAL, MAX_QUERIES, MAX_SPLITS, PAGE_SIZES, cache_dims,  # noqa: E402,F401
                            check_decode_inputs, check_values)
from .shapes import softmax_scale  # noqa: E402

MAX_ROWS_PER_TILE = 64    # stacked query rows per program; more rows get more row blocks


@dataclass(frozen=True)
class DecodeConfig:
    block_m: int         # stacked query rows per program (G * N_q, padded to a power of two >= 16)
    block_n: int         # keys per K/V tile
    num_warps: int
    num_stages: int

    def as_dict(self) -> dict:
        return dict(block_m=self.block_m, block_n=self.block_n, num_warps=self.num_warps,
                    num_stages=self.num_stages)


@dataclass(frozen=True)
class DecodePlan:
    """Everything one call launches: shapes, tiles, splits and the inputs of the split rule.
    Plans are kept per shape (_decode_plan): the derived sizes each call reads are cached
    properties, computed once per plan."""

    batch: int
    heads: int
    kv_heads: int
    n_q: int
    n_max: int
    head_dim: int
    group: int            # query heads per KV head (H / H_kv)
    rows: int             # stacked rows per KV head: group * n_q
    row_blocks: int
    num_splits: int
    config: DecodeConfig
    split_rule: dict      # the inputs and the outcome of the rule (for traces and the dashboard)
    fused_merge: bool     # the merge runs in the last split program of each group (no 2nd launch)

    @property
    def stage1_grid(self) -> tuple[int, int, int]:
        return (self.num_splits, self.batch * self.kv_heads, self.row_blocks)

    @property
    def merge_grid(self) -> tuple[int, int]:
        """The merge's groups, (b * H_kv + kv_head, row block): the programs of the second
        launch, or the groups whose last split program merges (fused)."""
        return (self.batch * self.kv_heads, self.row_blocks)

    @property
    def merge_groups(self) -> int:
        return self.batch * self.kv_heads * self.row_blocks if self.num_splits > 1 else 0

    @cached_property
    def merge_m(self) -> int:
        """Rows merged at a time: the real stacked rows (a power of two), not the Q tile's padding."""
        return min(triton.next_power_of_2(self.rows), self.config.block_m)

    @cached_property
    def head_dim_pad(self) -> int:
        """The kernels' head-dim tile width: D rounded up to a power of two, at least 16."""
        return padded_head_dim(self.head_dim)

    @cached_property
    def split_chunk(self) -> int:
        """Splits per merge load: all of them when merge_m x splits x D fits in about 64 fp32
        registers per thread, so one round trip to L2 fetches a row group's partials."""
        budget = 64 * 32 * self.config.num_warps
        return max(1, min(triton.next_power_of_2(self.num_splits), budget // (self.merge_m * self.head_dim_pad)))

    @cached_property
    def even_merge(self) -> bool:
        """The merge needs no mask: one row block of exactly merge_m rows, every split in one
        chunk, D a power of two (the partials of a group are one dense block)."""
        return (self.num_splits == self.split_chunk and self.rows == self.merge_m and self.row_blocks == 1
                and self.head_dim == self.head_dim_pad)


def default_decode_config(head_dim: int, rows: int, dtype: torch.dtype, block_n=None, num_warps=None,
                          num_stages=None, fills_gpu: bool = False) -> DecodeConfig:
    """Small Q tile, K/V tiles sized so several stages of loads stay in flight (bandwidth bound).

    Arguments:
        head_dim, rows (stacked query rows per KV head), dtype: the call's.
        block_n, num_warps, num_stages: explicit values, taken as given.
        fills_gpu: the work items alone (B * H_kv * row blocks) fill the GPU (one split): then
            16-bit tiles of D <= 128 are 128 keys wide, 3 stages; otherwise 64 keys, 4 stages.
            On an H200 (data/benchmarks/causal-decode-probe-nvidia-h200.json, H 32 / H_kv 8, CUDA
            graphs) 64-key tiles with 3 stages read 0.89x cuDNN at B 64, 4 stages 0.99-1.00x and
            128-key tiles 0.99-1.01x; at B 1-8 64-key tiles with 4 stages 0.99-1.03x.
    Returns:
        DecodeConfig."""
    block_m = min(max(16, triton.next_power_of_2(rows)), MAX_ROWS_PER_TILE)
    bn, stages = (64, 4) if padded_head_dim(head_dim) <= 128 else (32, 3)
    if dtype == torch.float32:
        bn, stages = min(bn, 32), 3
    elif fills_gpu and bn == 64 and block_n is None and num_stages is None:
        bn, stages = 128, 3
    return DecodeConfig(block_m, block_n or bn, num_warps or 4, num_stages or stages)


def num_splits_heuristic(work_items: int, sm_count: int, n_blocks: int, max_splits: int = MAX_SPLITS) -> int:
    """FlashAttention-2's rule (flash_api.cpp, num_splits_heuristic), restated.

    If the work items without splitting nearly fill the GPU (>= 80% of the SMs), use 1 split.
    Otherwise, for s = 1 .. min(max_splits, SMs, key blocks), the wave efficiency of s splits is
    waves / ceil(waves) with waves = work_items * s / SMs; skip s whose blocks per split equal
    those of s - 1 (the same split in effect); take the smallest s within 85% of the best
    efficiency — few splits, because every split adds a partial output to write and merge.
    """
    if work_items >= 0.8 * sm_count:
        return 1
    max_splits = min(max_splits, sm_count, n_blocks)
    eligible = [s for s in range(1, max_splits + 1)
                if s == 1 or math.ceil(n_blocks / s) != math.ceil(n_blocks / (s - 1))]
    eff = {}
    for s in eligible:
        waves = work_items * s / sm_count
        eff[s] = waves / math.ceil(waves)
    best = max(eff.values())
    return next(s for s in eligible if eff[s] >= 0.85 * best)


def choose_num_splits(batch: int, kv_heads: int, row_blocks: int, n_max: int, block_n: int,
                      sm_count: int) -> tuple[int, dict]:
    """The "auto" split count and the inputs it came from.

    Work items W = B * H_kv * row blocks (the query heads of a KV head share one program), key
    blocks = ceil(N_max / block_n) of the cache's allocated length — not the per-sequence
    lengths, which live on the device and would cost a synchronisation to read (FlashAttention
    decides from max_seqlen_k the same way).

    Rule: when W <= SMs / 2, one full wave — S = SMs // W, the most splits whose programs all
    start at once, one per SM (capped by the key blocks and MAX_SPLITS); otherwise
    FlashAttention-2's `num_splits_heuristic` (1 split from 80% of the SMs). Why one wave:
    FA-2's rule takes the smallest S within 85% of the best wave efficiency and gave 14 splits
    (112 programs) for B=1, H_kv 8 on the H100's 132 SMs, where 16 splits (128 programs)
    measured fastest at 4k, 32k and 128k, and every count past one wave (20..64) slower:
    programs of a second, partial wave start late and finish last. Where both rules apply they mostly agree
    (B=8: W=64, 2 splits either way).
    """
    work_items = batch * kv_heads * row_blocks
    n_blocks = max(1, triton.cdiv(n_max, block_n))
    fa2 = num_splits_heuristic(work_items, sm_count, n_blocks)
    if 2 * work_items <= sm_count:
        splits, name = max(1, min(sm_count // work_items, n_blocks, MAX_SPLITS)), "one full wave (SMs // work items)"
    else:
        splits, name = fa2, "flash-attention-2 num_splits_heuristic"
    rule = {"rule": name, "work_items": work_items, "sm_count": sm_count, "key_blocks": n_blocks,
            "block_n": block_n, "max_splits": MAX_SPLITS, "num_splits": splits, "flash_attention_2": fa2}
    return splits, rule


def decode_plan(q, k_cache, num_splits="auto", block_n=None, num_warps=None, num_stages=None,
                fused_merge=True, block_table=None) -> DecodePlan:
    """The plan of a call (built once per shape and setting, see _decode_plan).

    Arguments:
        q, k_cache: the call's query and K cache (or K pool with block_table); only shapes,
            dtype and device are read.
        num_splits, block_n, num_warps, num_stages, fused_merge: as flash_decode takes them.
        block_table: the paged cache's table, or None.
    Returns:
        DecodePlan."""
    b, h, n_q, d = q.shape
    h_kv, n_max = cache_dims(k_cache, block_table)
    return _decode_plan(b, h, n_q, d, h_kv, n_max, q.dtype, str(q.device), num_splits, block_n,
                        num_warps, num_stages, bool(fused_merge), block_table is not None)


@lru_cache(maxsize=256)
def _decode_plan(b, h, n_q, d, h_kv, n_max, dtype, device, num_splits, block_n, num_warps,
                 num_stages, fused_merge, paged=False) -> DecodePlan:
    """Built once per shape and setting: the split rule and the config stay off the hot path
    (a decode step is tens of microseconds of GPU time; host work per call shows up in it)."""
    group = h // h_kv
    rows = group * n_q
    sms = device_facts(device).sm_count
    block_m = default_decode_config(d, rows, dtype).block_m
    # one split under the auto rule; a paged cache keeps tiles of 64 keys (128-key tiles over
    # pages of 16 were not faster on an H200: data/benchmarks/serving-sweep-nvidia-h200.json)
    fills = not paged and b * h_kv * triton.cdiv(rows, block_m) >= 0.8 * sms
    cfg = default_decode_config(d, rows, dtype, block_n, num_warps, num_stages, fills_gpu=fills)
    if cfg.block_n not in BLOCK_SIZES:
        raise ValueError(f"block_n={cfg.block_n} is not supported; use one of {', '.join(map(str, BLOCK_SIZES))}")
    row_blocks = triton.cdiv(rows, cfg.block_m)
    auto, rule = choose_num_splits(b, h_kv, row_blocks, n_max, cfg.block_n, sms)
    splits = auto if num_splits == "auto" else int(num_splits)
    rule = {**rule, "requested": num_splits, "num_splits": splits}
    return DecodePlan(b, h, h_kv, n_q, n_max, d, group, rows, row_blocks, splits, cfg, rule,
                      fused_merge and splits > 1)


@dataclass
class DecodeTraceBuffers:
    """Device buffers the kernels write when tracing (decoded by instrumentation.recording.decode)."""

    splits: torch.Tensor     # (programs, 6) int64: order, smid, t_start, t_end, k_start, k_end
    counter: torch.Tensor    # (1,) int32: interpreter order
    merge: torch.Tensor      # (merge groups, 4) int64: split that merged (-1: merge kernel), smid, t_start, t_end
    m_part: torch.Tensor     # (B, H_kv, S, rows) fp32: m_j natural units (written for S = 1 too)
    l_part: torch.Tensor     # (B, H_kv, S, rows) fp32: l_j


def make_trace_buffers(plan: DecodePlan, device) -> DecodeTraceBuffers:
    """Arguments: plan, the call's DecodePlan; device, where the call runs.
    Returns: DecodeTraceBuffers sized for the plan, records -1 and stats NaN until written."""
    s = plan.stage1_grid
    programs = s[0] * s[1] * s[2]
    stats = (plan.batch, plan.kv_heads, plan.num_splits, plan.rows)
    return DecodeTraceBuffers(
        splits=torch.full((programs, 6), -1, dtype=torch.int64, device=device),
        counter=torch.zeros(1, dtype=torch.int32, device=device),
        merge=torch.full((max(plan.merge_groups, 1), 4), -1, dtype=torch.int64, device=device),
        m_part=torch.full(stats, float("nan"), dtype=torch.float32, device=device),
        l_part=torch.full(stats, float("nan"), dtype=torch.float32, device=device))


def flash_decode(q, k_cache, v_cache, cache_seqlens=None, num_splits="auto", sm_scale=None,
                 return_lse=False, block_n=None, num_warps=None, num_stages=None, fused_merge=True,
                 use_tma=False, trace: DecodeTraceBuffers | None = None, hw_clock: bool | None = None,
                 plan: DecodePlan | None = None, stages="both", *, block_table=None, validate=False):
    """Split-KV decoding attention.

    Arguments:
        q: (B, H, N_q, D), N_q 1..16; k_cache, v_cache: (B, H_kv, N_max, D), H % H_kv == 0, or
            pools (num_blocks, page_size, H_kv, D) with block_table.
        cache_seqlens: (B,) int32 (int64 is copied) valid lengths, or None: every sequence is N_max.
        num_splits: "auto" (choose_num_splits: from shapes, never from the lengths) or 1..MAX_SPLITS.
        sm_scale: the softmax scale, None for 1/sqrt(D).
        return_lse: also return the log-sum-exp.
        block_n, num_warps, num_stages: tile and launch overrides (default_decode_config).
        fused_merge: False merges the splits in a second launch.
        use_tma: load the off-band K/V tiles through tensor descriptors (Hopper's bulk copy;
            CUDA, contiguous caches, D a power of two).
        trace, hw_clock, plan, stages ('both' | 'split' | 'merge'): for instrumentation, eager
            only (outside the custom op): a prepared plan skips the checks, and a stage can be
            launched alone to time it (with the fused merge, 'split' is the whole op).
        block_table: (B, max_blocks) int32 for a paged cache, page_size 1..256 (kernels.paged);
            int64 or strided tables are copied.
        validate: False (the default) reads neither cache_seqlens nor block_table on the host
            (no synchronisation; CUDA-graph capturable): a length outside 0..N_max or a table
            entry in use outside the pool is never dereferenced, and that sequence's rows of O and
            lse come back NaN. True refuses them on the host in one line (a copy to the host).
    Returns:
        O (B, H, N_q, D) in q's dtype, or (O, lse) with lse (B, H, N_q) float32 in natural log
        units (-inf and O = 0 for a row that sees no key). Raises ValueError (one line) for
        shapes, dtypes, devices and settings the kernels do not take, before any launch.
    """
    if trace is not None or plan is not None or stages != "both" or hw_clock is not None:
        return _eager_decode(q, k_cache, v_cache, cache_seqlens, num_splits, sm_scale, return_lse, block_n,
                             num_warps, num_stages, fused_merge, use_tma, trace, hw_clock, plan, stages,
                             block_table, validate)
    checked = check_decode_inputs(q, k_cache, v_cache, cache_seqlens, num_splits, sm_scale, block_table,
                                  validate=False)
    if validate:
        checked = _validated(q, k_cache, cache_seqlens, block_table)
    if block_table is not None and use_tma:
        raise ValueError("use_tma=True reads a contiguous cache; a paged cache is read through its block table")
    args = (q, k_cache, v_cache, cache_seqlens, checked, softmax_scale(sm_scale, q.shape[3]),
            0 if num_splits == "auto" else num_splits, block_n or 0, num_warps or 0, num_stages or 0,
            bool(fused_merge), bool(use_tma), bool(return_lse))
    if torch.compiler.is_compiling():
        o, lse = torch.ops.tilescope.flash_decode(*args)
    else:
        # eager: the op's implementation without its Python dispatch (~100 us of host time per call
        # on this project's CPUs, more than the rest of the call), as kernels.flash_ops does
        if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k_cache, v_cache)):
            raise ValueError(GRAD_REFUSAL)
        o, lse = decode_impl(*args)
    return (o, lse) if return_lse else o


@outside_graph                      # torch.compiler.disable
def _validated(q, k_cache, cache_seqlens, block_table):
    """validate=True: the host reads of the lengths and the table (eager even under torch.compile)."""
    return check_values(cache_seqlens, block_table, q.shape[0], cache_dims(k_cache, block_table)[1], k_cache)


@outside_graph                      # torch.compiler.disable
def _eager_decode(q, k_cache, v_cache, cache_seqlens, num_splits, sm_scale, return_lse, block_n, num_warps,
                  num_stages, fused_merge, use_tma, trace, hw_clock, plan, stages, block_table, validate):
    """Instrumentation's calls (trace, hw_clock, a prepared plan, one stage): eager, outside the op."""
    if plan is None:
        block_table = check_decode_inputs(q, k_cache, v_cache, cache_seqlens, num_splits, sm_scale, block_table,
                                          validate=validate)
        plan = decode_plan(q, k_cache, num_splits, block_n, num_warps, num_stages, fused_merge, block_table)
    elif block_table is not None:
        block_table = block_table.to(torch.int32).contiguous()
    if block_table is not None and use_tma:
        raise ValueError("use_tma=True reads a contiguous cache; a paged cache is read through its block table")
    o, lse = run_plan(plan, q, k_cache, v_cache, cache_seqlens, block_table, sm_scale, return_lse, use_tma, trace,
                  hw_clock, stages)
    return (o, lse) if return_lse else o


# -- the custom op: torch.compile sees one opaque node; CUDA graphs capture it (no host reads) --

@torch.library.custom_op("tilescope::flash_decode", mutates_args=())
def decode_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: Optional[torch.Tensor],
              block_table: Optional[torch.Tensor], sm_scale: float, num_splits: int, block_n: int,
              num_warps: int, num_stages: int, fused_merge: bool, use_tma: bool,
              return_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """tilescope::flash_decode: flash_decode's launch on checked inputs (flash_decode runs the
    checks first). num_splits 0 is "auto"; block_n, num_warps, num_stages 0 are the defaults;
    block_table int32 contiguous or None. Returns (O, lse): lse (B, H, N_q) float32 when
    return_lse, else an empty float32 tensor."""
    return decode_impl(q, k_cache, v_cache, cache_seqlens, block_table, sm_scale, num_splits, block_n, num_warps,
                       num_stages, fused_merge, use_tma, return_lse)


def decode_impl(q, k_cache, v_cache, cache_seqlens, block_table, sm_scale, num_splits, block_n, num_warps,
                num_stages, fused_merge, use_tma, return_lse):
    """The one implementation behind tilescope::flash_decode and flash_decode's eager calls."""
    plan = decode_plan(q, k_cache, num_splits or "auto", block_n or None, num_warps or None, num_stages or None,
                       fused_merge, block_table)
    return run_plan(plan, q, k_cache, v_cache, cache_seqlens, block_table, sm_scale, return_lse, use_tma)


@decode_op.register_fake
def _decode_op_fake(q, k_cache, v_cache, cache_seqlens, block_table, sm_scale, num_splits, block_n, num_warps,
                    num_stages, fused_merge, use_tma, return_lse):
    b, h, n_q, _ = q.shape
    return (q.new_empty(q.shape),
            q.new_empty((b, h, n_q) if return_lse else (0,), dtype=torch.float32))


def _refuse_grad(ctx, inputs, output):
    raise ValueError(GRAD_REFUSAL)


decode_op.register_autograd(lambda ctx, *grads: None, setup_context=_refuse_grad)
