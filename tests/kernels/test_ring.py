"""Ring attention against float64 attention on one device: gloo ranks in spawned processes (the
kernel in Triton's interpreter), world sizes 2 and 3, full and causal, natural and zigzag.
GPU (`gpu`): NCCL with 2 and 4 ranks at realistic sizes."""

import math
from unittest import mock

import pytest
import torch

from instrumentation.recording.ranks import launch
from kernels.reference import reference_attention
from kernels.ring import (KernelCall, locate, merge_partial, rank_chunks, shard, step_plan,
                          unshard)

CASES = [(mask, layout) for mask in ("full", "causal") for layout in ("natural", "zigzag")]


def inputs(b, h, n, d, dtype=torch.float32, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed * 1009 + n)
    return [torch.randn(b, h, n, d, generator=g).to(dtype).to(device) for _ in range(3)]


def rel_err(out, ref):
    return ((out.double().cpu() - ref).norm() / ref.norm()).item()


def _ring_cases(rank, world, n, device_kind="cpu", dtype=torch.float32, b=1, h=2, d=16):
    """Each rank: every (mask, layout) case on the same inputs; its outputs and step records."""
    import kernels.ring
    from kernels.ring import ring_attention

    device = torch.device("cuda", rank) if device_kind == "cuda" else torch.device("cpu")
    q, k, v = inputs(b, h, n, d, dtype, seed=world, device=device)
    results = {}
    for mask, layout in CASES:
        qs, ks, vs = (shard(t, rank, world, layout) for t in (q, k, v))
        records, kept = [], (ks.clone(), vs.clone())
        o, lse = ring_attention(qs, ks, vs, mask=mask, layout=layout, return_lse=True,
                                trace=records.append)
        assert torch.equal(ks, kept[0]) and torch.equal(vs, kept[1])   # the caller's K/V are only read
        results[mask, layout] = (o.cpu(), lse.cpu(), records)
    # double buffering (the buffer-reuse path from 4 ranks up) gives the same bits
    qs, ks, vs = (shard(t, rank, world, "zigzag") for t in (q, k, v))
    results["two_buffers"] = torch.equal(ring_attention(qs, ks, vs, mask="causal", layout="zigzag", kv_buffers=2),
                                         results["causal", "zigzag"][0].to(device))
    # step 0's full tiles first, the other steps, then step 0's diagonal tiles straight into the
    # output: which calls run, in order
    calls, attend = [], kernels.ring.attend_into
    with mock.patch.object(kernels.ring, "attend_into",
                           lambda *a, **kw: (calls.append(kw.get("tiles", "all")), attend(*a, **kw))):
        ring_attention(qs, ks, vs, mask="causal", layout="zigzag")
    results["tiles"] = calls
    results["planned_calls"] = sum(len(step_plan(rank_chunks(rank, world, "zigzag"),
                                                 rank_chunks((rank - s) % world, world, "zigzag"), n // (2 * world),
                                                 "causal")) for s in range(world))
    # GQA: every query head of the pair reads the one K/V head that travels
    qs, ks, vs = (shard(t, rank, world, "zigzag") for t in (q, k[:, :1], v[:, :1]))
    results["gqa"] = ring_attention(qs, ks, vs, mask="causal", layout="zigzag").cpu()
    return results


@pytest.mark.parametrize("world", [2, 3])
def test_ring_matches_float64_attention(world):
    n = 8 * 2 * world                                 # zigzag chunks of 8 rows; natural of 16
    per_rank = launch(_ring_cases, world, "gloo", (n,))
    q, k, v = inputs(1, 2, n, 16, seed=world)
    for mask, layout in CASES:
        ref, m, l = reference_attention(q, k, v, mask=mask)
        o = unshard([r[mask, layout][0] for r in per_rank], world, layout)
        lse = unshard([r[mask, layout][1] for r in per_rank], world, layout)
        assert rel_err(o, ref) < 1e-3, (world, mask, layout)
        assert torch.allclose(lse.double(), m + torch.log(l), atol=1e-4), (world, mask, layout)
        for rank, r in enumerate(per_rank):
            _check_steps(r[mask, layout][2], rank, world, mask, layout, compute_first=False)
    for r in per_rank:   # diagonal last: step 0 its full tiles, then the other steps, then the diagonal
        assert r["tiles"] == ["full"] + ["all"] * (r["planned_calls"] - 1) + ["partial"]
    ref, _, _ = reference_attention(q, k[:, :1], v[:, :1], mask="causal")
    assert rel_err(unshard([r["gqa"] for r in per_rank], world, "zigzag"), ref) < 1e-3
    assert all(r["two_buffers"] for r in per_rank)


def _check_steps(records, rank, world, mask, layout, compute_first):
    """Trace invariants: one record per step, every K/V chunk met once, skips only where the
    mask hides the whole pair, and every visible chunk pair computed exactly once. The order in a
    step: CUDA queues the compute before posting the transfer (compute_first), gloo posts the
    transfer first so that it runs while the host computes."""
    assert [r["step"] for r in records] == list(range(world))
    assert sorted(r["kv_rank"] for r in records) == list(range(world))
    q_chunks = rank_chunks(rank, world, layout)
    pairs = [tuple(p) for r in records for p in r["pairs"]]
    visible = [(qc, kc) for qc in q_chunks for kc in range(world * len(q_chunks))
               if mask == "full" or kc <= qc]
    assert sorted(pairs) == sorted(visible)
    for r in records:
        hidden = mask == "causal" and all(kc > qc for qc in q_chunks for kc in r["kv_chunks"])
        assert r["skipped"] == hidden
        assert r["compute_start"] <= r["compute_end"]
        sends = r["step"] < world - 1
        assert (r["bytes_sent"] > 0) == sends and (r["send_to"] == (rank + 1) % world) == sends
        if sends:
            assert r["recv_start"] <= r["recv_end"]
            if not compute_first:   # gloo: posted before the host computes, so it overlaps
                assert r["send_start"] <= r["compute_start"]
            elif r["step"] == 0:    # CUDA: later steps' compute waits in the queue, the post does not
                assert r["compute_start"] <= r["send_start"]
    if layout == "zigzag" and mask == "causal":   # the point of zigzag: equal work at every step
        assert len({r["score_entries"] for r in records[1:]}) == 1


def test_shard_unshard_round_trip_and_errors():
    x = torch.arange(2 * 3 * 24 * 4).reshape(2, 3, 24, 4)
    for world in (1, 2, 3, 4, 6):
        for layout in ("natural", "zigzag"):
            if 24 % (world * (1 if layout == "natural" else 2)):
                continue
            parts = [shard(x, r, world, layout) for r in range(world)]
            assert torch.equal(unshard(parts, world, layout), x)
    assert torch.equal(shard(x, 0, 3, "zigzag")[:, :, 4:], x[:, :, 20:])   # chunks 0 and 5
    with pytest.raises(ValueError, match="does not split into 10 equal chunks"):
        shard(x, 0, 5, "zigzag")
    with pytest.raises(ValueError, match="layout"):
        shard(x, 0, 2, "striped")
    with pytest.raises(ValueError, match="one part per rank"):
        unshard([x], 2)


def test_kv_buffers_below_two_is_refused_before_any_transfer():
    from kernels.ring import ring_attention

    q = torch.randn(1, 1, 8, 4)
    for bad in (1, 0, 2.5, True):
        with pytest.raises(ValueError, match="kv_buffers must be an integer >= 2"):
            ring_attention(q, q, q, kv_buffers=bad)


def test_locate_finds_every_row():
    n, world = 48, 3
    for layout in ("natural", "zigzag"):
        seen = {}
        for row in range(n):
            rank, local = locate(row, n, world, layout)
            assert rank_chunks(rank, world, layout)[local // (n // world // (1 if layout == "natural" else 2))] \
                == row // (n // (world * (1 if layout == "natural" else 2)))
            seen[rank, local] = row
        assert len(seen) == n


def test_step_plan_zigzag_halves():
    # rank 1 of 3 zigzag holds chunks (1, 4); K/V of rank 0 = (0, 5): all Q vs the first chunk
    assert step_plan((1, 4), (0, 5), 8, "causal") == [KernelCall(0, 16, 0, 8, False)]
    # K/V of rank 2 = (2, 3): the second Q chunk vs both
    assert step_plan((1, 4), (2, 3), 8, "causal") == [KernelCall(8, 16, 0, 16, False)]
    assert step_plan((1, 4), (1, 4), 8, "causal") == [KernelCall(0, 16, 0, 16, True)]
    assert step_plan((0,), (1,), 8, "causal") == []
    assert KernelCall(0, 16, 0, 16, True).score_entries == 16 * 17 // 2


def test_score_entries_counts_bottom_right_causal_pairs():
    g = torch.Generator().manual_seed(3)
    for _ in range(200):
        nq, nk, lo = (int(x) for x in torch.randint(1, 90, (3,), generator=g))
        rows = torch.arange(nq)[:, None] + nk - nq >= torch.arange(nk)[None, :]   # bottom-right
        assert KernelCall(lo, lo + nq, 0, nk, True).score_entries == int(rows.sum())
        assert KernelCall(lo, lo + nq, 0, nk, False).score_entries == nq * nk


def test_merge_is_the_two_state_merge_and_associative(device):
    g = torch.Generator().manual_seed(5)
    s = torch.randn(1, 2, 70, 12, generator=g, dtype=torch.float64)    # scores: 70 rows (two row blocks), 12 keys
    v = torch.randn(1, 2, 12, 24, generator=g, dtype=torch.float64)
    s[0, 1, 3, :8] = float("-inf")                                     # a row that sees only the last keys
    s[0, 0, 5, :] = float("-inf")                                      # a row that sees no key at all

    def part(lo, hi):
        lse = torch.logsumexp(s[..., lo:hi], -1)
        p = torch.where(lse[..., None] > -math.inf, torch.exp(s[..., lo:hi] - lse[..., None]), 0.0)
        return (p @ v[:, :, lo:hi]).to(device, torch.float16), lse.to(device, torch.float32)

    full_o, full_lse = part(0, 12)
    for order in ([(0, 4), (4, 8), (8, 12)], [(8, 12), (0, 4), (4, 8)]):
        o = torch.zeros(1, 2, 80, 24, device=device)                   # merge into row views 5..75
        lse = torch.full((1, 2, 80), -math.inf, device=device)
        for lo, hi in order:
            merge_partial(o[:, :, 5:75], lse[:, :, 5:75], *part(lo, hi))
        assert torch.allclose(o[:, :, 5:75].cpu(), full_o.float().cpu(), atol=2e-3)
        assert torch.equal(lse[0, 0, 10].cpu(), torch.tensor(-math.inf))
        finite = full_lse.cpu() > -math.inf
        assert torch.allclose(lse[:, :, 5:75].cpu()[finite], full_lse.cpu()[finite], atol=1e-5)
        assert (o[:, :, :5] == 0).all() and (lse[:, :, 75:] == -math.inf).all()   # nothing outside the view


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_ring_on_gpus_matches_one_gpu(world):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA devices")
    from kernels import flash_attention

    n = 4096 * world
    per_rank = launch(_ring_cases, world, "nccl", (n, "cuda", torch.bfloat16, 1, 8, 128))
    q, k, v = inputs(1, 8, n, 128, torch.bfloat16, seed=world, device="cuda")
    for mask, layout in CASES:
        ref = flash_attention(q, k, v, mask=mask).double().cpu()
        o = unshard([r[mask, layout][0] for r in per_rank], world, layout)
        assert rel_err(o, ref) < 2e-2, (world, mask, layout)
        for rank, r in enumerate(per_rank):
            _check_steps(r[mask, layout][2], rank, world, mask, layout, compute_first=True)
    assert all(r["two_buffers"] for r in per_rank)
    for r in per_rank:
        assert r["tiles"] == ["full"] + ["all"] * (r["planned_calls"] - 1) + ["partial"]
