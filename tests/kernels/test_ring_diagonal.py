"""launch_attention(tiles="full" / "partial"): a call's two halves, as the ring runs its step-0
causal call with the diagonal last (kernels.ring): the full tiles into a float32
accumulator, other keys merged into it, then the partial tiles resumed from it into the output in
q's dtype. Against float64 on every mask, N_q != N_k, GQA, padded D and rows that see no key."""

import pytest
import torch

from kernels import flash_attention, reference_attention
from kernels.flash import launch_attention
from tests.kernels.test_masks import mask_texts


def rel_err(out, ref):
    return ((out.double().cpu() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("n_q,n_k,h_kv,d", [(100, 100, 2, 32), (64, 160, 1, 24), (160, 64, 2, 16)])
def test_full_then_partial_tiles_equal_one_call(n_q, n_k, h_kv, d, device):
    g = torch.Generator().manual_seed(n_q + 2 * n_k + d)
    q = torch.randn(1, 2, n_q, d, generator=g).to(device)                   # (B, H, N_q, D)
    k, v = (torch.randn(1, h_kv, n_k, d, generator=g).to(device) for _ in range(2))
    for text in mask_texts(min(n_q, n_k)) if n_q == n_k else ["full", "causal"]:
        ref, m, l = reference_attention(q, k, v, mask=text)
        acc = torch.full(q.shape, float("nan"), device=device)             # float32 (B, H, N_q, D)
        lse = torch.full(q.shape[:3], float("nan"), device=device)         # (B, H, N_q)
        kw = dict(mask=text, block_m=32, block_n=32)
        launch_attention(q, k, v, out=(acc, lse), tiles="full", **kw)
        out = torch.empty_like(q)
        launch_attention(q, k, v, out=(out, lse), o_prev=acc, tiles="partial", **kw)
        assert rel_err(out, ref) < 1e-3, text
        ref_lse = m + torch.log(l)                                          # -inf where no key
        assert torch.equal(torch.isinf(lse.cpu()), torch.isinf(ref_lse)), text
        fin = torch.isfinite(ref_lse)
        assert torch.allclose(lse.cpu().double()[fin], ref_lse[fin], atol=1e-4), text
        # without o_prev the partial tiles resume from out's own o
        launch_attention(q, k, v, out=(acc, lse), tiles="full", **kw)
        launch_attention(q, k, v, out=(acc, lse), tiles="partial", **kw)
        assert rel_err(acc, ref) < 1e-3, text


def test_other_keys_merged_between_the_halves(device):
    """The ring's order: diagonal pair's full tiles, an earlier chunk merged in, the diagonal's
    partial tiles last, written in bf16 (fp16 on the interpreter's side: any float dtype)."""
    n, d = 64, 16
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 2 * n, d, generator=g).to(device) for _ in range(3))   # (B, H, 2n, D)
    ref, m, l = reference_attention(q, k, v, mask="causal")
    lo, hi = (slice(None), slice(None), slice(0, n)), (slice(None), slice(None), slice(n, 2 * n))
    qh, kh, vh, kl, vl = (t.contiguous() for t in (q[hi], k[hi], v[hi], k[lo], v[lo]))
    acc = torch.empty(qh.shape, dtype=torch.float32, device=device)
    lse = torch.empty(qh.shape[:3], dtype=torch.float32, device=device)
    kw = dict(block_m=16, block_n=16)
    launch_attention(qh, kh, vh, mask="causal", out=(acc, lse), tiles="full", **kw)
    launch_attention(qh, kl, vl, mask="full", out=(acc, lse), merge=True, **kw)
    out = torch.empty(qh.shape, dtype=torch.float16, device=device)
    launch_attention(qh.half(), kh.half(), vh.half(), mask="causal", out=(out, lse), o_prev=acc, tiles="partial", **kw)
    assert out.dtype == torch.float16 and rel_err(out, ref[hi]) < 5e-3
    assert torch.allclose(lse.cpu().double(), (m + torch.log(l))[hi], atol=1e-2)


def test_tiles_errors_are_one_line(device):
    q = torch.randn(1, 1, 32, 16, device=device)
    o, lse = torch.empty_like(q), torch.empty(1, 1, 32, device=device)
    for kw, fragment in ((dict(tiles="diagonal"), "tiles='diagonal'"), (dict(tiles="full"), "with out="),
                         (dict(tiles="partial", out=(o, lse), merge=True), "no merge")):
        with pytest.raises(ValueError, match=fragment):
            launch_attention(q, q, q, **kw)
    with pytest.raises(ValueError, match="o_prev goes with"):
        launch_attention(q, q, q, out=(o, lse), o_prev=o)


@pytest.mark.gpu
def test_gpu_warp_specialised_halves_match_one_call():
    """bf16 at a size where the causal call takes the WS split: the halves as the ring runs them
    (float32 accumulator, then the output in bf16) give the one call's result."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(1, 4, 8192, 128, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    one, lse_one = flash_attention(q, k, v, mask="causal", return_lse=True)
    acc = torch.empty(q.shape, dtype=torch.float32, device="cuda")
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device="cuda")
    out = torch.empty_like(q)
    launch_attention(q, k, v, mask="causal", out=(acc, lse), tiles="full")
    launch_attention(q, k, v, mask="causal", out=(out, lse), o_prev=acc, tiles="partial")
    assert ((out.float() - one.float()).norm() / one.float().norm()).item() < 1e-2
    assert torch.allclose(lse, lse_one, atol=1e-3)
