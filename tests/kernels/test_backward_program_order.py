"""The order the Triton backward's programs take their items (kernels.tile_ops.grouped_slot, the
host's kernels.gluon_bwd_launch.program_head_groups): the heads in groups of nearly equal size, a
group's blocks rank by rank across its heads. In the interpreter programs run one after another in
program order, so each item's trace record says which program ran it; the gradients do not depend
on the order, bit for bit."""

import dataclasses

import numpy as np
import pytest
import torch

import kernels.backward_launch as backward_launch
from kernels import flash_attention
from kernels.backward import backward_config, backward_trace_buffers, flash_attention_backward
from kernels.gluon_bwd_launch import program_head_groups
from tests.kernels.test_backward import make


def grouped_programs(n_heads: int, n_blocks: int, groups: int) -> np.ndarray:
    """program[item]: which program runs item head * n_blocks + rank, the heads in `groups`
    groups of nearly equal size (the first n_heads % groups one larger), rank by rank in a group."""
    sizes = [n_heads // groups + (i < n_heads % groups) for i in range(groups)]
    program, p, first = np.empty(n_heads * n_blocks, dtype=np.int64), 0, 0
    for size in sizes:
        for rank in range(n_blocks):
            for head in range(first, first + size):
                program[head * n_blocks + rank] = p
                p += 1
        first += size
    return program


def run(q, k, v, do, o, lse, cfg, groups, monkeypatch):
    """Gradients and the passes' records with the dK/dV heads in groups[0] groups, dQ's in groups[1]
    (each capped at its head count)."""
    calls = iter(groups)
    monkeypatch.setattr(backward_launch, "program_head_groups", lambda heads, n_blocks, device: min(next(calls), heads))
    tr = backward_trace_buffers(q, k, "causal", (0,), config=cfg)
    grads = flash_attention_backward(do, q, k, v, o, lse, "causal", config=cfg, trace=tr)
    return grads, tr


@pytest.mark.parametrize("split", [False, True], ids=["one program per key block", "split dK and dV"])
def test_programs_take_the_heads_in_groups_and_the_gradients_keep_their_bits(split, monkeypatch):
    b, h, h_kv, n_q, n_k, d = 2, 6, 3, 70, 90, 16
    q, k, v, do = make(b, h, h_kv, n_q, n_k, d, seed=4)
    o, lse = flash_attention(q, k, v, "causal", return_lse=True)
    cfg = dataclasses.replace(backward_config(d, q.dtype, q.device), block_m1=16, block_n1=16, block_m2=16,
                              block_n2=16, split_dkdv=split)
    (want, tr0) = run(q, k, v, do, o, lse, cfg, (b * h_kv, b * h), monkeypatch)        # head after head
    n_kb, n_qb = tr0.plan.kv_plan.n_kb, tr0.plan.q_plan.n_qb
    assert n_kb >= 3 and n_qb >= 3
    for groups in [(1, 1), (4, 5), (2, 12)]:      # 6 KV heads in 4 groups: 2, 2, 1, 1; 12 heads in 5: 3, 3, 2, 2, 2
        got, tr = run(q, k, v, do, o, lse, cfg, groups, monkeypatch)
        assert all(torch.equal(x, y) for x, y in zip(got, want)), groups
        order = tr.work[tr.n_delta:, 0].numpy() - tr.n_delta     # the programs ran (and counted) in program order
        assert sorted(order) == list(range(tr.n_dkdv + tr.n_dq)), groups
        dkdv = grouped_programs(b * h_kv, n_kb, min(groups[0], b * h_kv))
        if split:       # an item's two programs side by side
            dkdv = np.stack([2 * dkdv, 2 * dkdv + 1], 1).reshape(-1)
        assert np.array_equal(order[:tr.n_dkdv], dkdv), groups
        assert np.array_equal(order[tr.n_dkdv:], tr.n_dkdv + grouped_programs(b * h, n_qb, min(groups[1], b * h)))


def test_group_counts_follow_the_device(monkeypatch):
    import kernels.gluon_bwd_launch as gbl
    from kernels.runtime import DeviceFacts

    monkeypatch.setattr(gbl, "device_facts", lambda device: DeviceFacts("cuda", (9, 0), 132, "h200", True, False))
    # B4 H16 at 4k: 32 key blocks of 128 per head, 2 * 132 / 32 -> 9 heads a group, 64 heads -> 8 groups
    assert program_head_groups(64, 32, "cuda") == 8
    assert program_head_groups(64, 128, "cuda") == 22           # 16k: 3 heads a group (20 of 3, 2 of 2)
    assert program_head_groups(16, 64, "cuda") == 4             # GQA B2 H_kv 8 at 8k: 5 heads a group
    assert program_head_groups(5, 8, "cuda") == 1               # fewer heads than a group: one group
    assert program_head_groups(3, 1000, "cuda") == 3            # past 2 waves a head: head after head
    monkeypatch.setattr(gbl, "device_facts", lambda device: DeviceFacts("cpu", (0, 0), 4, None, False, False))
    assert program_head_groups(6, 2, "cpu") == 2                # the interpreter's 4 "SMs": 4 heads a group
