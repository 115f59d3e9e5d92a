"""flash_decode against the float64 reference (interpreter in CI, compiled on a GPU)."""

import math

import pytest
import torch

from kernels import flash_decode, reference_decode
from kernels.decode import choose_num_splits, num_splits_heuristic
from tests.kernels.attention_checks import ON_GPU, check, decode_inputs, every_pair

# ragged lengths with a length of 1 (and, for N_q = 4, rows that see nothing); GQA, MQA, MHA.
# Compiled: every combination; in the interpreter, every pair of values of any two of the three
# parameters (9 cases of the 18: each split count with each layout, N_q alternating so that each
# N_q meets every split count and every layout)
N_QS, SPLITS, LAYOUTS = (1, 4), (1, 3, "auto"), ((8, 2, 32), (4, 1, 40), (2, 2, 17))
RAGGED = ([(n_q, s, *hd) for n_q in N_QS for s in SPLITS for hd in LAYOUTS] if ON_GPU else
          [(N_QS[(i + j) % 2], s, *hd) for i, s in enumerate(SPLITS) for j, hd in enumerate(LAYOUTS)])
_CASES = [(n_q, s, tuple(hd)) for n_q, s, *hd in RAGGED]
assert every_pair(_CASES, N_QS, SPLITS, LAYOUTS)


@pytest.mark.parametrize("n_q,num_splits,h,h_kv,d", RAGGED)
def test_ragged_gqa_against_float64(n_q, num_splits, h, h_kv, d, device):
    seed = n_q * 100 + d + (0 if num_splits == "auto" else num_splits)
    (q, k, v), _ = decode_inputs(3, h, h_kv, n_q, 97, d, torch.float32, device, seed)
    lens = torch.tensor([97, 1, 50], dtype=torch.int32, device=device)
    out, lse = flash_decode(q, k, v, cache_seqlens=lens, num_splits=num_splits, return_lse=True)
    ref_o, ref_lse = reference_decode(q, k, v, lens)
    check(out, lse, ref_o, ref_lse, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_full_cache(dtype, device):
    (q, k, v), _ = decode_inputs(2, 4, 2, 2, 130, 64, dtype, device, seed=7)
    out, lse = flash_decode(q, k, v, num_splits=2, return_lse=True, sm_scale=0.2)
    ref_o, ref_lse = reference_decode(q, k, v, sm_scale=0.2)
    check(out, lse, ref_o, ref_lse, dtype)
    assert out.dtype == dtype and out.shape == q.shape


def test_split_count_does_not_change_the_result(device):
    (q, k, v), _ = decode_inputs(2, 4, 2, 1, 200, 32, torch.float32, device, seed=3)
    lens = torch.tensor([200, 123], dtype=torch.int32, device=device)
    outs = [flash_decode(q, k, v, lens, num_splits=s) for s in (1, 2, 5, 16)]
    for o in outs[1:]:
        assert (o - outs[0]).abs().max().item() < 1e-5


def test_heuristic_is_flash_attentions_rule():
    # few work items: the smallest split count within 85% of the best wave efficiency
    for work, sms, blocks in [(8, 132, 512), (1, 132, 64), (24, 108, 40), (3, 4, 7)]:
        s = num_splits_heuristic(work, sms, blocks)
        eff = lambda n: work * n / sms / math.ceil(work * n / sms)  # noqa: E731
        eligible = [n for n in range(1, min(128, sms, blocks) + 1)
                    if n == 1 or math.ceil(blocks / n) != math.ceil(blocks / (n - 1))]
        best = max(eff(n) for n in eligible)
        assert s in eligible and eff(s) >= 0.85 * best
        assert all(eff(n) < 0.85 * best for n in eligible if n < s)
    assert num_splits_heuristic(106, 132, 512) == 1                       # >= 80% of the SMs busy


def test_auto_fills_one_wave_when_work_items_are_few():
    # B=1, H_kv 8 on 132 SMs: 16 splits, 128 programs, all in the first wave (FA-2's rule: 14)
    splits, rule = choose_num_splits(1, 8, 1, 32768, 64, 132)
    assert rule["work_items"] == 8 and rule["key_blocks"] == 512 and splits == rule["num_splits"] == 16
    assert rule["flash_attention_2"] == num_splits_heuristic(8, 132, 512) == 14
    for b, kv, n_max, sms in [(1, 8, 4096, 132), (8, 8, 32768, 132), (3, 2, 300, 108), (1, 1, 96, 132)]:
        s, r = choose_num_splits(b, kv, 1, n_max, 64, sms)
        w = b * kv
        if 2 * w <= sms:   # one wave: no program waits, and one more split would not fit
            assert s * w <= sms and (s == min(r["key_blocks"], 128) or (s + 1) * w > sms)
        else:
            assert s == num_splits_heuristic(w, sms, r["key_blocks"])
    assert choose_num_splits(8, 8, 1, 32768, 64, 132)[0] == 2              # W = 64: both rules agree
    assert choose_num_splits(64, 8, 1, 32768, 64, 132)[0] == 1             # W = 512 fills the GPU


@pytest.mark.parametrize("call,fragment", [
    (lambda q, k, v: flash_decode(q[0], k, v), "4 dimensions"),
    (lambda q, k, v: flash_decode(q, k, v[:, :, :5]), "same shape"),
    (lambda q, k, v: flash_decode(q[:, :3], k, v), "multiple of H_kv"),
    (lambda q, k, v: flash_decode(q.expand(-1, -1, 17, -1), k, v), "N_q=17"),
    (lambda q, k, v: flash_decode(q.half(), k, v), "share a dtype"),
    (lambda q, k, v: flash_decode(q, k, v, cache_seqlens=torch.tensor([5, 99], dtype=torch.int32, device=q.device), validate=True),
     "0..N_max"),
    (lambda q, k, v: flash_decode(q, k, v, cache_seqlens=torch.tensor([5, 3.0], device=q.device)), "int32"),
    (lambda q, k, v: flash_decode(q, k, v, cache_seqlens=torch.tensor([5], dtype=torch.int32, device=q.device)), "one length per sequence"),
    (lambda q, k, v: flash_decode(q, k, v, num_splits=0), "num_splits"),
    (lambda q, k, v: flash_decode(q, k, v, num_splits="many"), "num_splits"),
    (lambda q, k, v: flash_decode(q, k, v, sm_scale=-1.0), "sm_scale"),
    (lambda q, k, v: flash_decode(q, k.transpose(2, 3), v.transpose(2, 3)), "contiguous last"),
])
def test_bad_input_is_one_clear_line(call, fragment, device):
    (q, k, v), _ = decode_inputs(2, 4, 2, 1, 16, 16, torch.float32, device, seed=1)
    with pytest.raises(ValueError, match=fragment) as info:
        call(q, k, v)
    assert "\n" not in str(info.value)


@pytest.mark.gpu
@pytest.mark.parametrize("n_q", [1, 4])
@pytest.mark.parametrize("num_splits", [1, "auto"])
def test_realistic_sizes_on_the_gpu(n_q, num_splits, device):
    # Llama-3-8B attention shapes: H 32, H_kv 8, D 128, bf16; a ragged batch up to 8k
    (q, k, v), _ = decode_inputs(3, 32, 8, n_q, 8192, 128, torch.bfloat16, device, seed=11)
    lens = torch.tensor([8192, 1, 5000], dtype=torch.int32, device=device)
    out, lse = flash_decode(q, k, v, cache_seqlens=lens, num_splits=num_splits, return_lse=True)
    ref_o, ref_lse = reference_decode(q, k, v, lens)
    check(out, lse, ref_o, ref_lse, torch.bfloat16)


@pytest.mark.gpu
def test_odd_head_dims_and_mqa_on_the_gpu(device):
    for d in (80, 96, 111, 256):
        (q, k, v), _ = decode_inputs(2, 16, 1, 2, 3000, d, torch.float16, device, seed=d)
        lens = torch.tensor([3000, 77], dtype=torch.int32, device=device)
        out, lse = flash_decode(q, k, v, cache_seqlens=lens, return_lse=True)
        ref_o, ref_lse = reference_decode(q, k, v, lens)
        check(out, lse, ref_o, ref_lse, torch.float16)


def test_decode_tiles_widen_only_where_the_work_items_fill_the_gpu():
    """64-key tiles with 4 stages; 128-key tiles with 3 where B * H_kv * row blocks alone fill
    the GPU (one split) and the cache is contiguous; fp32 and D 256 keep 32-key tiles."""
    from kernels.decode import _decode_plan, default_decode_config

    bf16 = torch.bfloat16
    cfg = lambda **kw: default_decode_config(128, 4, bf16, **kw).as_dict()  # noqa: E731
    assert cfg() == dict(block_m=16, block_n=64, num_warps=4, num_stages=4)
    assert cfg(fills_gpu=True) == dict(block_m=16, block_n=128, num_warps=4, num_stages=3)
    assert cfg(fills_gpu=True, block_n=32)["block_n"] == 32 and cfg(fills_gpu=True, num_stages=2)["block_n"] == 64
    assert default_decode_config(128, 4, torch.float32, fills_gpu=True).block_n == 32
    assert default_decode_config(256, 4, bf16, fills_gpu=True).block_n == 32
    # the interpreter models 4 SMs: 8 KV heads of one sequence fill it; 1 does not
    plan = lambda b, h_kv, paged: _decode_plan(b, 4 * h_kv, 1, 128, h_kv, 4096, bf16, "cpu", "auto",  # noqa: E731
                                               None, None, None, True, paged)
    assert plan(1, 8, False).config.block_n == 128 and plan(1, 8, False).num_splits == 1
    assert plan(1, 8, True).config.block_n == 64
    assert plan(1, 1, False).config.block_n == 64 and plan(1, 1, False).num_splits > 1


@pytest.mark.parametrize("scale", [1e38, 2.5e4, 1e-30, True, float("nan"), "0.1"])
def test_sm_scale_has_flash_attentions_bound(scale, device):
    # these were accepted and gave NaN outputs: the scaled float32 scores overflow (or are ~0)
    (q, k, v), _ = decode_inputs(2, 4, 2, 1, 16, 16, torch.float32, device, seed=1)
    with pytest.raises(ValueError, match="sm_scale") as info:
        flash_decode(q, k, v, num_splits=2, sm_scale=scale)
    assert "\n" not in str(info.value)
    from kernels.shapes import softmax_scale
    with pytest.raises(ValueError) as same:
        softmax_scale(scale, 16)
    assert str(info.value) == str(same.value)                     # flash_attention's line


def test_sm_scale_at_its_bounds_is_accepted(device):
    """The bounds that refuse the scales above, themselves and a plain scale: finite outputs
    (once, not again for each refused scale)."""
    from kernels.shapes import MAX_SM_SCALE, MIN_SM_SCALE

    (q, k, v), _ = decode_inputs(2, 4, 2, 1, 16, 16, torch.float32, device, seed=1)
    for ok in (MIN_SM_SCALE, MAX_SM_SCALE, 3):
        assert torch.isfinite(flash_decode(q, k, v, num_splits=2, sm_scale=ok)).all(), ok
