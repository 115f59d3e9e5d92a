"""The one-launch causal run (kernels.flash MASKED_TAIL): the full-tile loop runs on into the
partial tiles that follow each block's full run and masks them. On Hopper it is the
warp-specialised loop; forced here without WS so the interpreter checks the masked tail against
float64 on every mask whose plan allows it, N_q != N_k, GQA, padded D and rows that see no key."""

import pytest
import torch

from kernels import flash_attention, parse_mask, reference_attention
from tests.kernels.test_masks import mask_texts


def rel_err(out, ref):
    return ((out.double().cpu() - ref).norm() / ref.norm()).item()


def test_partial_follows_full_only_where_the_diagonal_ends_each_run():
    import kernels.flash as fl

    plan = lambda text, n_q, n_k: fl.block_plan(parse_mask(text, n_q, n_k), n_q, 32, 32, "cpu", n_k)  # noqa: E731
    assert plan("causal", 128, 128).partial_follows_full
    assert plan("causal", 64, 160).partial_follows_full          # bottom-right: 3 full tiles, then the diagonal
    assert plan("causal", 160, 64).partial_follows_full          # top rows see nothing (skipped)
    assert not plan("full", 128, 128).partial_follows_full       # no partial tile: nothing to mask
    assert not plan("sliding_window:80", 128, 128).partial_follows_full   # a partial tile before the full run
    assert plan("prefix_lm:64", 128, 128).partial_follows_full
    assert not plan("document:40,50,38", 128, 128).partial_follows_full   # intervals start inside a tile
    p = plan("causal", 160, 64)
    first = [int(x) for x in p.run_start]
    for qb, row in enumerate(p.block_map):
        vis = [j for j, s in enumerate(row) if s]
        assert first[qb] == (vis[0] if vis else 0)


@pytest.mark.parametrize("n_q,n_k,h_kv,d", [(96, 96, 2, 32), (64, 160, 1, 24), (160, 64, 2, 16)])
def test_masked_tail_run_matches_float64(n_q, n_k, h_kv, d, device, monkeypatch):
    import kernels.flash as fl

    ran = []

    def forced(ws, plan):
        ran.append(plan.partial_follows_full)
        return plan.partial_follows_full and plan.n_k % plan.block_n == 0
    monkeypatch.setattr(fl, "_masked_tail", forced)
    g = torch.Generator().manual_seed(n_q * 3 + n_k + d)
    q = torch.randn(1, 2, n_q, d, generator=g).to(device)                   # (B, H, N_q, D)
    k, v = (torch.randn(1, h_kv, n_k, d, generator=g).to(device) for _ in range(2))
    for text in mask_texts(min(n_q, n_k)) if n_q == n_k else ["full", "causal"]:
        ran.clear()
        out, lse = flash_attention(q, k, v, mask=text, block_m=32, block_n=32, return_lse=True)
        ref, m, l = reference_attention(q, k, v, mask=text)
        assert rel_err(out, ref) < 1e-3, text
        ref_lse = m + torch.log(l)                                            # -inf where no key
        assert torch.equal(torch.isinf(lse.cpu()), torch.isinf(ref_lse)), text
        fin = torch.isfinite(ref_lse)
        assert torch.allclose(lse.cpu().double()[fin], ref_lse[fin], atol=1e-4), text
        if text == "causal":
            assert ran == [True], "the causal call did not take the masked-tail run"


def test_masked_tail_merges_into_an_accumulator(device, monkeypatch):
    """As a ring's step 0 then step 1: the masked-tail causal call overwrites a float32 (O, lse)
    accumulator, a full call over other keys merges into it; equals attention over all keys."""
    import kernels.flash as fl

    monkeypatch.setattr(fl, "_masked_tail", lambda ws, plan: plan.partial_follows_full)
    n, d = 64, 16
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 2 * n, d, generator=g).to(device) for _ in range(3))   # (B, H, 2n, D)
    ref, m, l = reference_attention(q, k, v, mask="causal")
    hi = (slice(None), slice(None), slice(n, 2 * n))
    lo = (slice(None), slice(None), slice(0, n))
    o = torch.empty(q[hi].shape, dtype=torch.float32, device=device)
    lse = torch.empty(q[hi].shape[:3], dtype=torch.float32, device=device)
    flash_attention(q[hi].contiguous(), k[hi].contiguous(), v[hi].contiguous(), mask="causal",
                    block_m=32, block_n=32, out=(o, lse))
    flash_attention(q[hi].contiguous(), k[lo].contiguous(), v[lo].contiguous(), mask="full",
                    block_m=32, block_n=32, out=(o, lse), merge=True)
    assert rel_err(o, ref[hi]) < 1e-3
    assert torch.allclose(lse.cpu().double(), (m + torch.log(l))[hi], atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("n_q,n_k", [(8192, 8192), (4096, 8192)])
def test_gpu_causal_is_one_warp_specialised_launch_and_right(n_q, n_k, monkeypatch):
    """On Hopper a long causal call is one warp-specialised launch (Triton compiles the masked
    tail inside the WS loop: nothing refused), and right against SDPA in float32."""
    import kernels.flash as fl

    if not fl.warp_specialize_supported(torch.device("cuda")):
        pytest.skip("needs a Hopper GPU with warp specialisation")
    launches = []
    real = fl._launch
    monkeypatch.setattr(fl, "_launch", lambda grid, args, consts: (launches.append(consts), real(grid, args, consts)))
    g = torch.Generator(device="cuda").manual_seed(n_q + n_k)
    q = torch.randn(1, 4, n_q, 128, generator=g, device="cuda", dtype=torch.bfloat16)   # (B, H, N_q, D)
    k, v = (torch.randn(1, 4, n_k, 128, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    monkeypatch.setattr(fl, "MASKED_TAIL", True)
    refused = set(fl._WS_REFUSED)
    out, lse = flash_attention(q, k, v, mask="causal", return_lse=True)
    torch.cuda.synchronize()
    assert fl._WS_REFUSED == refused, "Triton refused the warp-specialised masked-tail loop"
    assert [(c["WARP_SPECIALIZE"], c["MASKED_TAIL"]) for c in launches] == [(True, True)]
    mask = torch.ones(n_q, n_k, dtype=torch.bool, device="cuda").tril(n_k - n_q)          # bottom-right
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    assert torch.isfinite(out).all()
    assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-2
