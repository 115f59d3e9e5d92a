"""The `merge` table of record_decode: one row per (b, kv_head, row block), and with the fused
merge it names the split program that finished its group last (interpreter: the run order)."""

import numpy as np
import pytest
import torch

from instrumentation import make_decode_inputs, record_decode
from kernels import reference_decode


def check_merge_table(trace, fused, device):
    merge, splits = trace.merge, trace.splits
    s = trace.meta["shape"]
    assert len(merge) == s["B"] * s["H_kv"] * trace.meta["kernel"]["row_blocks"]
    assert (merge.fused == fused).all()
    assert trace.meta["kernel"]["merge_programs"] == (0 if fused else len(merge))
    assert (trace.meta["bytes"]["stage2"] == 0) == fused
    for rec in merge.itertuples():
        group = splits[(splits.b == rec.b) & (splits.kv_head == rec.kv_head) & (splits.row_block == rec.row_block)]
        if not fused:
            assert rec.split == -1
            continue
        merger = group[group.split == rec.split]
        assert len(merger) == 1 and merger.program.iloc[0] == rec.program
        if device.type == "cpu":
            assert merger.order.iloc[0] == group.order.max()                   # the last to run
        else:     # one clock for the GPU: the merge starts after every split of its group ended
            assert rec.t_start >= group.t_end.max() and rec.t_end >= rec.t_start


@pytest.mark.parametrize("fused", [True, False])
def test_merge_table_says_where_each_group_was_merged(fused, device):
    q, k, v = make_decode_inputs(2, 8, 2, 60, 16, n_q=2, dtype="fp32", seed=9, device=str(device))
    lens = torch.tensor([60, 33], dtype=torch.int32, device=device)
    out, trace = record_decode(q, k, v, lens, num_splits=4, fused_merge=fused, measure=False)
    ref_o, _ = reference_decode(q, k, v, lens)
    assert ((out.double().cpu() - ref_o).norm() / ref_o.norm()).item() < 1e-4
    check_merge_table(trace, fused, device)
    assert np.isfinite(trace.partials.lse).all()


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False])
def test_merge_table_on_the_gpu_at_32k(fused, device):
    q, k, v = make_decode_inputs(1, 32, 8, 32768, 128, dtype="bf16", seed=2, device="cuda")
    out, trace = record_decode(q, k, v, num_splits="auto", fused_merge=fused, measure=False)
    check_merge_table(trace, fused, device)
    assert trace.merge.sm.between(0, trace.meta["sm_count"] - 1).all()
