"""The backward's sm_scale bound (sm_scale * sqrt(D) <= kernels.shapes.MAX_BACKWARD_SCALED): a call
asking for gradients above it is refused in one line before any forward runs (eager, the op route and
the explicit backward); at the bound the float32 gradients of unit-variance inputs match float64
autograd; the forward alone still takes scales up to MAX_SM_SCALE."""

import pytest
import torch

import kernels.flash_ops as flash_ops
from kernels import flash_attention
from kernels.backward import flash_attention_backward
from kernels.shapes import MAX_BACKWARD_SCALED, MAX_SM_SCALE


def _inputs(d, device, n=48, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(1, 2, n, d, generator=g).to(device) for _ in range(4))
    return [t.requires_grad_(grad) for t in (q, k, v)], do


def _float64_grads(q, k, v, do, scale):
    q, k, v = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    n = q.shape[2]
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    (torch.softmax(s, -1) @ v).backward(do.cpu().double())
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize("route", ["eager", "op"])
def test_gradients_above_the_bound_are_refused_before_the_forward(route, monkeypatch, device):
    (q, k, v), _ = _inputs(16, device)
    forwards = []
    real = flash_ops.forward_impl
    monkeypatch.setattr(flash_ops, "forward_impl", lambda *a, **kw: (forwards.append(1), real(*a, **kw))[1])
    if route == "op":                       # the route torch.compile takes (the op's Python body)
        monkeypatch.setattr(flash_ops, "_is_compiling", lambda: True)
    with pytest.raises(ValueError, match=r"at D=16 is above 75, the largest the backward keeps accurate") as err:
        flash_attention(q, k, v, mask="causal", sm_scale=100)           # 100 * sqrt(16) = 400 > 300
    assert "\n" not in str(err.value) and not forwards
    with torch.no_grad():                   # the forward alone keeps its own bound
        out = flash_attention(q, k, v, mask="causal", sm_scale=MAX_SM_SCALE)
    assert torch.isfinite(out).all() and forwards


def test_explicit_backward_above_the_bound_is_refused(device):
    (q, k, v), do = _inputs(16, device, grad=False)
    o, lse = flash_attention(q, k, v, mask="causal", sm_scale=1e3, return_lse=True)
    with pytest.raises(ValueError, match="above 75") as err:
        flash_attention_backward(do, q, k, v, o, lse, "causal", sm_scale=1e3)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("d", [16, 128])
def test_float32_gradients_at_the_bound_match_float64(d, device):
    """At sm_scale = 300 / sqrt(D) (D 128: 26.5, where scale 100 was off by 60 % in dQ)."""
    (q, k, v), do = _inputs(d, device, seed=d)
    scale = MAX_BACKWARD_SCALED / d ** 0.5
    out = flash_attention(q, k, v, mask="causal", sm_scale=scale)
    out.backward(do)
    for ours, ref in zip((q.grad, k.grad, v.grad), _float64_grads(q, k, v, do, scale)):
        assert torch.isfinite(ours).all()
        err = ((ours.cpu().double() - ref).norm() / ref.norm()).item()
        assert err < 1e-3, (d, err)
