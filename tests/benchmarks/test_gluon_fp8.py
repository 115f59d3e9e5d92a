"""benchmarks.gluon_fp8 (a probe on Hopper): on the same quantised inputs its FP8 attention equals
the Triton FP8 kernel's to FP8's precision, for full and causal masks, GQA and ragged lengths."""

import pytest
import torch


@pytest.mark.gpu
@pytest.mark.parametrize("mask,h,h_kv,n_q,n_k,d,block_n", [("causal", 4, 2, 1000, 1000, 128, 128),
                                                           ("full", 4, 4, 700, 1300, 128, 64),
                                                           ("causal", 2, 2, 1024, 1024, 256, 64)])
def test_gluon_fp8_probe_matches_the_triton_fp8_kernel(mask, h, h_kv, n_q, n_k, d, block_n):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("Gluon's Hopper kernel needs Hopper")
    from benchmarks.gluon_fp8 import attention_fp8_gluon, keys_relabelled
    from kernels.fp8 import attention_fp8
    from kernels.fp8_quant import quantize_fp8

    g = torch.Generator(device="cuda").manual_seed(n_q + d)
    q = torch.randn(2, h, n_q, d, generator=g, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, h_kv, n_k, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    x = quantize_fp8(q, k, v, block_m=128, block_n=block_n, mask=mask)
    want, want_lse = attention_fp8(x, mask, return_lse=True)
    seen = torch.isfinite(want_lse)
    outs = {}
    for relabel in (False, True):       # P.V's operand in key_order(), on V^T stored in it
        out, lse = outs[relabel] = attention_fp8_gluon(keys_relabelled(x) if relabel else x, mask, relabel=relabel)
        assert ((out.float() - want.float()).norm() / want.float().norm()).item() < 2e-2, relabel
        assert torch.equal(torch.isfinite(lse), seen) and (lse[seen] - want_lse[seen]).abs().max().item() < 1e-2
    # the same products over the same keys in another order: equal up to the fp32 sums' order
    assert ((outs[True][0].float() - outs[False][0].float()).norm() / want.float().norm()).item() < 1e-3
    assert torch.equal(outs[True][1], outs[False][1])       # the softmax statistics see the keys in order
    # the ping-pong orders the two groups' products, not what each computes: the same bits
    for stages in (2, 3):           # nor does the ring's depth
        out, lse = attention_fp8_gluon(keys_relabelled(x), mask, stages=stages, relabel=True, pingpong=True)
        assert torch.equal(out, outs[True][0]) and torch.equal(lse, outs[True][1]), stages


@pytest.mark.parametrize("block_n,head_dim", [(64, 128), (128, 128), (64, 256)])
def test_relabelled_scores_sit_where_the_e4m3_operand_wants_them(block_n, head_dim):
    """key_order() is what makes P.V's register operand a renaming of the scores' registers: with
    column j of the operand standing for key key_order()[j], every thread of a consumer warpgroup
    holds under the e4m3 A-operand layout exactly the (row, key) elements it holds under the scores'
    wgmma accumulator layout (Triton's linear layouts of both, as Gluon builds them)."""
    gl = pytest.importorskip("triton.experimental.gluon.language")
    from triton._C.libtriton import gluon_ir, ir

    from benchmarks.gluon_fp8 import key_order

    ctx = ir.context()
    ir.load_dialects(ctx)
    builder = gluon_ir.GluonOpBuilder(ctx)

    def held(layout):       # thread (lane, warp) -> the set of (row, column) its registers hold
        lin = builder.to_linear_layout(layout._to_ir(builder), [64, block_n])
        out = {}
        for hw in range(1 << (len(lin.reg_bases) + len(lin.lane_bases) + len(lin.warp_bases))):
            bits = [(hw >> i) & 1 for i in range(len(lin.reg_bases) + len(lin.lane_bases) + len(lin.warp_bases))]
            row = col = 0
            for bit, (r, c) in zip(bits, lin.reg_bases + lin.lane_bases + lin.warp_bases):
                if bit:
                    row, col = row ^ r, col ^ c
            thread = hw >> len(lin.reg_bases)
            out.setdefault(thread, set()).add((row, col))
        return out

    scores = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, block_n, 32])
    operand = gl.DotOperandLayout(operand_index=0, k_width=4, parent=gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, head_dim, 32]))
    order = key_order(block_n).tolist()
    assert sorted(order) == list(range(block_n))
    by_scores, by_operand = held(scores), held(operand)
    assert by_scores.keys() == by_operand.keys() and len(by_scores) == 128
    for thread, cells in by_operand.items():
        assert {(row, order[j]) for row, j in cells} == by_scores[thread], thread
    # and without the relabelling the threads would have to trade elements
    assert any(cells != by_scores[t] for t, cells in by_operand.items())
