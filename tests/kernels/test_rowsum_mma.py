"""The full-tile loop's row sums on the tensor cores (kernels.flash ROWSUM_MMA: P times a ones
tile, carried like acc). On Hopper it runs in the warp-specialised loop; forced here in the
interpreter, so the carried sums are checked against float64 on every mask, N_q != N_k, GQA,
padded D, merged into an accumulator and resumed by the split's second launch."""

import pytest
import torch

from kernels import flash_attention, reference_attention
from kernels.flash import launch_attention
from tests.kernels.test_masks import mask_texts


def rel_err(out, ref):
    return ((out.double().cpu() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("n_q,n_k,h_kv,d", [(100, 100, 2, 32), (64, 160, 1, 24)])
@pytest.mark.parametrize("split", [False, True])
def test_row_sums_on_the_tensor_cores_match_float64(n_q, n_k, h_kv, d, split, device, monkeypatch):
    import kernels.launch_config as rules

    used = []
    monkeypatch.setattr(rules, "rowsum_mma", lambda ws, trace_rows, plan: used.append(1) or True)
    if split:   # the full tiles with the MMA row sums, then the partial tiles resumed from them
        monkeypatch.setattr(rules, "two_launches", lambda ws, plan: plan.has_partial)
    g = torch.Generator().manual_seed(n_q + n_k + d)
    q = torch.randn(1, 2, n_q, d, generator=g).to(device)                   # (B, H, N_q, D)
    k, v = (torch.randn(1, h_kv, n_k, d, generator=g).to(device) for _ in range(2))
    for text in mask_texts(min(n_q, n_k)) if n_q == n_k else ["full", "causal"]:
        out, lse = flash_attention(q, k, v, mask=text, block_m=32, block_n=32, return_lse=True)
        ref, m, l = reference_attention(q, k, v, mask=text)
        assert rel_err(out, ref) < 1e-3, text
        ref_lse = m + torch.log(l)
        assert torch.equal(torch.isinf(lse.cpu()), torch.isinf(ref_lse)), text
        fin = torch.isfinite(ref_lse)
        assert torch.allclose(lse.cpu().double()[fin], ref_lse[fin], atol=1e-4), text
    assert used
    # merged into an accumulator that holds other keys (a ring step)
    acc = torch.empty(q.shape, dtype=torch.float32, device=device)
    acc_lse = torch.empty(q.shape[:3], dtype=torch.float32, device=device)
    half = n_k // 2
    launch_attention(q, k[:, :, :half], v[:, :, :half], mask="full", out=(acc, acc_lse), block_m=32, block_n=32)
    launch_attention(q, k[:, :, half:], v[:, :, half:], mask="full", out=(acc, acc_lse), merge=True,
                    block_m=32, block_n=32)
    ref, _, _ = reference_attention(q, k, v, mask="full")
    assert rel_err(acc, ref) < 1e-3


def test_row_sums_on_the_tensor_cores_where_the_loops_are_long(monkeypatch):
    """Warp-specialised, untraced: every full plan; causal only from ROWSUM_MIN_FULL full tiles per
    query block on average (causal 16k in 128-blocks: 63.5, off; 32k: 127.5, on)."""
    import kernels.launch_config as rules
    from kernels import parse_mask
    from kernels.plan import block_plan

    plan = lambda text, n: block_plan(parse_mask(text, n, n), n, 128, 128, "cpu", n)  # noqa: E731
    assert plan("causal", 16384).mean_full == 63.5 and plan("causal", 32768).mean_full == 127.5
    monkeypatch.setattr(rules, "ROWSUM_MMA", True)
    assert rules.rowsum_mma(True, False, plan("full", 2048))
    assert rules.rowsum_mma(True, False, plan("causal", 32768))
    assert not rules.rowsum_mma(True, False, plan("causal", 16384))
    assert not rules.rowsum_mma(False, False, plan("full", 2048))     # not warp-specialised
    assert not rules.rowsum_mma(True, True, plan("full", 2048))       # row states traced per tile


@pytest.mark.gpu
@pytest.mark.parametrize("mask", ["full", "causal"])
def test_gpu_row_sums_on_the_tensor_cores_match_sdpa(mask, monkeypatch):
    """bf16 where the loop is warp-specialised: the same output as the row sums in the softmax."""
    import kernels.launch as launch
    import kernels.launch_config as rules

    if not rules.warp_specialize_supported(torch.device("cuda")):
        pytest.skip("needs a Hopper GPU with warp specialisation")
    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = (torch.randn(1, 4, 8192, 128, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    monkeypatch.setattr(rules, "ROWSUM_MIN_FULL", 0)          # causal here has 31.5 full tiles per block
    refused = set(launch._WS_REFUSED)
    out, lse = flash_attention(q, k, v, mask=mask, return_lse=True)
    assert launch._WS_REFUSED == refused, "Triton refused the warp-specialised loop with the MMA row sums"
    monkeypatch.setattr(rules, "ROWSUM_MMA", False)
    launch.clear_caches()
    out0, lse0 = flash_attention(q, k, v, mask=mask, return_lse=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=mask == "causal")
    assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-2
    assert ((out.float() - out0.float()).norm() / out0.float().norm()).item() < 1e-2
    assert torch.allclose(lse, lse0, atol=1e-2)
