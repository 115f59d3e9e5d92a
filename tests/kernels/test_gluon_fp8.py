"""The Gluon FP8 kernel (kernels.gluon_fp8_kernel, kernels.gluon_fp8_launch): where a default call
takes it, the quantise pass's V^T in key order, and on a Hopper GPU that it equals float64
attention to FP8's precision for every mask kind, GQA, N_q != N_k and ragged lengths, that its
options leave its bits alone and that record() traces the kernel it times (a CUDA graph replays the
default causal call, the Gluon kernel on Hopper: tests/kernels/test_fp8.py). The interpreter cannot run Gluon: on the CPU the rule, the layouts and the quantise pass."""

import pytest
import torch

from kernels.fp8 import attention_fp8, default_launch, flash_attention_fp8
from kernels.fp8_quant import dequantize_fp8, fp8_config, key_order, quantize_fp8
from kernels.gluon_launch import gluon_available
from kernels.masks import MASKS, parse_mask

from .test_fp8 import FA3_PER_TENSOR_RMSE, inputs, rmse


# the LSE of the e4m3 P against the fp32 P's (the Gluon kernel's sum by P 1 against the Triton
# kernel's on the threads): each P rounds within e4m3's half ulp, a factor 1 + 2^-4, so their sums
# differ by at most that factor (a mean well below it: test_gpu_the_sum_by_p_1_...)
LSE_OF_E4M3_P = 0.0607             # log(1 + 2^-4)


@pytest.fixture
def gluon_gpu():
    """A Hopper GPU with Gluon, else the test skips (the gpu marker skips it without CUDA first)."""
    if not gluon_available(torch.device("cuda")):
        pytest.skip("needs Hopper and Gluon")


def test_the_rule_on_a_hopper_it_is_told_of(monkeypatch):
    """fp8_config's defaults take the Gluon kernel for the causal and full masks at padded D 128 and
    256 (128 x 128 tiles), N_q and N_k >= 128, on Hopper; never for another mask,
    head dim, explicit tiles or options, short sequences, gluon=False, or off Hopper."""
    import kernels.gluon_fp8_launch as launch

    causal = parse_mask("causal")
    assert not fp8_config(128, mask=causal, n_q=4096, device="cpu").gluon           # no Hopper here
    monkeypatch.setattr(launch, "gluon_available", lambda device: True)
    for d, mask in ((128, causal), (96, causal), (256, causal), (200, causal), (256, parse_mask("full")),
                    (128, parse_mask("full")), (100, parse_mask("full"))):
        c = fp8_config(d, mask=mask, n_q=4096, n_k=1000, device="cuda")
        assert c.gluon and (c.block_m, c.block_n) == (128, 128) and not c.ws and not c.split, d
        assert (c.num_warps, c.num_stages) == (4, 2), d
    refused = [dict(head_dim=64, mask=causal), dict(head_dim=64, mask=parse_mask("full")),
               dict(mask=parse_mask("sliding_window:512")),
               dict(mask=None), dict(mask=causal, block_n=128), dict(mask=causal, num_warps=8),
               dict(mask=causal, n_q=100), dict(mask=causal, n_k=64), dict(mask=causal, gluon=False),
               dict(mask=causal, device=None)]
    for kw in refused:
        args = dict(head_dim=128, n_q=4096, n_k=4096, device="cuda") | kw
        assert not fp8_config(**args).gluon, kw
    monkeypatch.setattr(launch, "gluon_available", lambda device: False)             # TILESCOPE_GLUON=0, say
    assert not fp8_config(128, mask=causal, n_q=4096, device="cuda").gluon


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("d,block_n", [(96, 128), (128, 64), (256, 64)])
def test_the_quantise_pass_stores_v_in_key_order(fused, d, block_n, device, monkeypatch):
    """With key_order, V^T's columns hold each 16 keys in key_order() and nothing else changes: the
    same bytes moved, Q, K and the scales equal, the dequantised V the same values."""
    import kernels.fp8_quant as fq

    monkeypatch.setattr(fq, "FUSED_QUANT", fused)
    q, k, v = inputs(2, 1, 150, 200, d, seed=3, device=device)
    plain = quantize_fp8(q, k, v, block_m=128, block_n=block_n, key_order=False)
    ordered = quantize_fp8(q, k, v, block_m=128, block_n=block_n, key_order=True)
    assert ordered.key_order and ordered.gluon and not plain.key_order and not plain.gluon
    tiles = plain.v.shape[-1] // block_n
    as_tiles = lambda t: t.view(torch.uint8).reshape(*t.shape[:-1], tiles, block_n)  # noqa: E731
    assert torch.equal(as_tiles(plain.v)[..., key_order(block_n).to(plain.v.device)], as_tiles(ordered.v))
    for a, b in ((plain.q, ordered.q), (plain.k, ordered.k), (plain.v_scale, ordered.v_scale)):
        assert torch.equal(a.view(torch.uint8) if a.dtype != torch.float32 else a,
                           b.view(torch.uint8) if b.dtype != torch.float32 else b)
    assert all(torch.equal(a, b) for a, b in zip(dequantize_fp8(plain), dequantize_fp8(ordered)))


def test_the_inputs_say_which_kernel_and_layout_they_are_for(device, monkeypatch):
    """A default causal quantise on (what it is told is) Hopper marks the inputs for the Gluon
    kernel, in key order where GLUON_FP8 relabels P (D 128 and 256) and in natural order where it
    does not, with the V^T bytes of the layout it says; gluon=False gives the Triton kernel's
    inputs; key order without the Gluon kernel is refused in one line."""
    import kernels.gluon_fp8_launch as launch

    monkeypatch.setattr(launch, "gluon_available", lambda device: True)
    for d in (128, 256):
        q, k, v = inputs(1, 1, 128, 256, d, seed=5, device=device)
        x = quantize_fp8(q, k, v, mask="causal")
        assert x.gluon and x.key_order == launch.GLUON_FP8[d].relabel and x.block_n == launch.GLUON_FP8[d].block_n
        natural = quantize_fp8(q, k, v, mask="causal", key_order=False)
        assert natural.gluon and not natural.key_order
        assert torch.equal(x.v.view(torch.uint8), natural.v.view(torch.uint8)) == (not x.key_order), d
        triton = quantize_fp8(q, k, v, mask="causal", gluon=False)
        assert not triton.gluon and not triton.key_order
    with pytest.raises(ValueError, match="Gluon FP8 kernel only") as info:
        quantize_fp8(q, k, v, mask="causal", gluon=False, key_order=True)
    assert "\n" not in str(info.value)


def test_key_order_relabels_the_scores_onto_the_e4m3_operand():
    """key_order() is what makes P V's register operand a renaming of the scores' registers: with
    column j of the operand standing for key key_order()[j], every thread of a consumer warpgroup
    holds under the e4m3 A-operand layout exactly the (row, key) elements it holds under the scores'
    wgmma accumulator layout (Triton's linear layouts of both, as Gluon builds them)."""
    gl = pytest.importorskip("triton.experimental.gluon.language")
    from triton._C.libtriton import gluon_ir, ir

    ctx = ir.context()
    ir.load_dialects(ctx)
    builder = gluon_ir.GluonOpBuilder(ctx)
    for block_n, head_dim in ((64, 128), (128, 128), (64, 256)):
        def held(layout):       # thread (lane, warp) -> the set of (row, column) its registers hold
            lin = builder.to_linear_layout(layout._to_ir(builder), [64, block_n])
            bases = lin.reg_bases + lin.lane_bases + lin.warp_bases
            out = {}
            for hw in range(1 << len(bases)):
                row = col = 0
                for i, (r, c) in enumerate(bases):
                    if (hw >> i) & 1:
                        row, col = row ^ r, col ^ c
                out.setdefault(hw >> len(lin.reg_bases), set()).add((row, col))
            return out

        scores = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, block_n, 32])
        operand = gl.DotOperandLayout(operand_index=0, k_width=4, parent=gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, head_dim, 32]))
        order = key_order(block_n).tolist()
        assert sorted(order) == list(range(block_n))
        by_scores, by_operand = held(scores), held(operand)
        assert by_scores.keys() == by_operand.keys() and len(by_scores) == 128
        for thread, cells in by_operand.items():
            assert {(row, order[j]) for row, j in cells} == by_scores[thread], (block_n, thread)
        # and without the relabelling the threads would have to trade elements
        assert any(cells != by_scores[t] for t, cells in by_operand.items())


def test_inputs_in_key_order_are_refused_where_the_gluon_kernel_cannot_run(device):
    q, k, v = inputs(2, 2, 130, 130, 128, device=device)
    x = quantize_fp8(q, k, v, block_m=128, block_n=128, key_order=True)
    if not gluon_available(x.q.device):
        with pytest.raises(ValueError, match="Hopper GPU only") as info:
            attention_fp8(x, "causal")
    else:
        with pytest.raises(ValueError, match="takes no warp_specialize") as info:
            attention_fp8(x, "causal", warp_specialize=False)
        small = quantize_fp8(q[..., :64], k[..., :64], v[..., :64], block_m=128, block_n=64, key_order=True)
        with pytest.raises(ValueError, match="128 x 128 tiles at a padded D of 128"):
            attention_fp8(small, "causal")
        with pytest.raises(ValueError, match="not 128 x 64 at 128"):
            attention_fp8(quantize_fp8(q, k, v, block_m=128, block_n=64, gluon=True), "causal")
    assert "\n" not in str(info.value)


@pytest.mark.gpu
@pytest.mark.parametrize("relabel", [True, False])
@pytest.mark.parametrize("d", [80, 128, 256])
@pytest.mark.parametrize("kind", sorted(MASKS))
def test_gpu_every_mask_against_float64(kind, d, relabel, gluon_gpu):
    """Every mask kind, P relabelled (V^T in key order) or not (GQA 8 / 2, N_q 1000 != N_k 1300,
    ragged tiles, D 80 padded to 128): finite, below FA3's per-tensor RMSE on the outlier recipe,
    within FP8's error of the Triton FP8 kernel on the same tiles, and the LSE within LSE_OF_E4M3_P of its."""
    from kernels.gluon_fp8_launch import GLUON_FP8

    n_q, n_k = 1000, 1000 if kind == "document" else 1300
    mask = MASKS[kind].default_text(n_q) if kind != "document" else "document:300,700"
    q, k, v = inputs(8, 2, n_q, n_k, d, seed=7, device="cuda")
    block_n = GLUON_FP8[128 if d <= 128 else 256].block_n
    x = quantize_fp8(q, k, v, block_m=128, block_n=block_n, mask=mask, gluon=True, key_order=relabel)
    assert x.gluon and x.key_order == relabel
    out, lse = attention_fp8(x, mask, return_lse=True)
    want, want_lse = attention_fp8(quantize_fp8(q, k, v, block_m=128, block_n=block_n, key_order=False), mask,
                                   return_lse=True)
    assert torch.isfinite(out).all()
    assert rmse(out, q, k, v, mask) < FA3_PER_TENSOR_RMSE
    assert ((out.float() - want.float()).norm() / want.float().norm()).item() < 2e-2
    seen = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), seen) and (lse[seen] - want_lse[seen]).abs().max().item() < LSE_OF_E4M3_P


@pytest.mark.gpu
@pytest.mark.parametrize("d", [128, 256])
def test_gpu_the_default_causal_call_runs_it_and_its_options_keep_the_bits(d, gluon_gpu):
    """A default causal call quantises for the Gluon kernel (in key order where it relabels P) and
    runs it (default_launch says so); the ping-pong, the ring's depth and the serial loop order the
    work, not what it computes (the same bits), and the other key layout gives the same products in another order."""
    from kernels.gluon_fp8_launch import GLUON_FP8, attention_fp8_gluon

    q, k, v = inputs(4, 2, 1024, 1024, d, seed=11, device="cuda")
    x = quantize_fp8(q, k, v, mask="causal")
    launch = default_launch(d, "causal", 1024, 1024, "cuda")
    assert x.gluon and x.key_order == GLUON_FP8[d].relabel == launch["relabel"] and launch["loop"] == "gluon"
    out, lse = flash_attention_fp8(q, k, v, "causal", return_lse=True)
    base, base_lse = attention_fp8_gluon(x, "causal", return_lse=True)
    assert torch.equal(out, base) and torch.equal(lse, base_lse)
    for stages, pingpong, serial in ((3, False, False), (2, True, False), (3, True, False), (2, False, True),
                                     (2, True, True)):
        # (at D 256 a third stage fits beside one Q buffer only: the kernel of a program per item)
        persistent = None if d == 128 or stages == 2 else False
        o, s = attention_fp8_gluon(x, "causal", return_lse=True, stages=stages, pingpong=pingpong, serial=serial,
                                   persistent=persistent)
        assert torch.equal(o, base) and torch.equal(s, base_lse), (stages, pingpong, serial)
    if d == 256:
        with pytest.raises(ValueError, match="2 stages") as info:
            attention_fp8_gluon(x, "causal", stages=3)
        assert "\n" not in str(info.value)
    other = quantize_fp8(q, k, v, mask="causal", key_order=not x.key_order)
    o, s = attention_fp8_gluon(other, "causal", return_lse=True)
    assert ((o.float() - base.float()).norm() / base.float().norm()).item() < 1e-3
    if GLUON_FP8[d].mma_sum:    # P 1 sums the relabelled keys in another order on the tensor cores
        assert (s - base_lse).abs().max().item() < 1e-3
    else:                       # the softmax statistics see the keys in order either way
        assert torch.equal(s, base_lse)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [128, 256])
@pytest.mark.parametrize("mask", ["full", "causal"])
def test_gpu_the_sum_by_p_1_is_as_accurate_as_the_threads_sum(d, mask, gluon_gpu):
    """The running sum taken by the product P 1 (mma_sum) or on the consumers' threads: over 48 key
    tiles (N 6144), O as close to float64 attention either way and the LSEs within e4m3's rounding
    of P (P 1 accumulated across tiles in the product's fp32 lost the sum: 6x O's error at 16k)."""
    from kernels.gluon_fp8_launch import attention_fp8_gluon

    q, k, v = inputs(2, 1, 6144, 6144, d, seed=5, device="cuda")
    x = quantize_fp8(q, k, v, block_m=128, block_n=128, mask=mask, gluon=True)
    (o_mma, lse_mma), (o_thr, lse_thr) = (attention_fp8_gluon(x, mask, return_lse=True, mma_sum=m) for m in (True,
                                                                                                          False))
    err_mma, err_thr = rmse(o_mma, q, k, v, mask), rmse(o_thr, q, k, v, mask)
    assert err_mma < 1.05 * err_thr and err_thr < 1.05 * err_mma and max(err_mma, err_thr) < FA3_PER_TENSOR_RMSE
    gap = (lse_mma - lse_thr).abs()
    assert gap.max().item() < LSE_OF_E4M3_P and gap.mean().item() < 3e-3


@pytest.mark.gpu
@pytest.mark.parametrize("d", [128, 256])
def test_gpu_record_traces_the_gluon_fp8_kernel_it_times(d, gluon_gpu):
    """record(precision="fp8") at the default tiles runs the Gluon kernel traced (D 128: the
    overlapped loop, D 256: the serial one): the same output bit for bit as the untraced call, every
    work item with its SM and clock span, each traced head's visited tiles exactly the plan's in
    visit order 0.., and each traced row's last (m, l) its lse."""
    from instrumentation import record

    q, k, v = inputs(4, 2, 1024, 1024, d, seed=13, device="cuda")
    out, trace = record(q, k, v, mask="causal", precision="fp8", level="full", trace_head=[0, 3],
                        trace_q_blocks="all", measure=False)
    assert trace.meta["block_m"] == 128 and trace.meta["block_n"] == 128
    assert trace.meta["kernel"]["implementation"] == "gluon"
    plain, lse = flash_attention_fp8(q, k, v, "causal", return_lse=True)
    assert torch.equal(out, plain)
    w = trace.work
    assert len(w) == 4 * 8 and (w.t_end > w.t_start).all() and (w.sm >= 0).all()
    for (bh, qb), items in trace.tiles.groupby(["bh", "q_block"]):
        seen = items[items.visited]
        assert set(seen.k_block) == set(items[items.status != "skipped"].k_block), (bh, qb)
        assert sorted(seen.order) == list(range(len(seen))), (bh, qb)
        assert (seen.cycles_end > seen.cycles_start).all()
    last = trace.rows.sort_values("step").groupby(["bh", "q_row"]).last().reset_index()
    want = lse.reshape(-1, 1024).cpu().double().numpy()
    got = last.m + last.l.apply(lambda x: float(torch.log(torch.tensor(x, dtype=torch.float64))))
    assert len(last) == 2 * 1024
    assert max(abs(g - want[bh, r]) for g, bh, r in zip(got, last.bh, last.q_row)) < 1e-3


@pytest.mark.gpu
def test_gpu_the_custom_op_takes_the_gluon_path_under_torch_compile(gluon_gpu):
    """At the Gluon kernel's sizes the custom op passes opcheck, and a compiled causal call is one
    op (fullgraph) with the eager result."""
    from kernels.fp8 import flash_attention_fp8_op

    q, k, v = inputs(2, 2, 1024, 1024, 128, seed=14, device="cuda")
    torch.library.opcheck(flash_attention_fp8_op, (q, k, v, "causal", None, "block", True, None, None, True),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    f = torch.compile(lambda q, k, v: flash_attention_fp8(q, k, v, "causal") * 2, fullgraph=True)
    assert torch.equal(f(q, k, v), flash_attention_fp8(q, k, v, "causal") * 2)
