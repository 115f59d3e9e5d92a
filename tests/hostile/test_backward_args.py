"""flash_attention_backward with tensors that do not fit the call: a dO of (1, 1, 1, 1), an
lse of (1, 1, 1), an o of (B, H, N, 1), a dlse of the wrong length, a wrong device or dtype. The
kernels read them without bounds checks (past the buffers, before these checks); each is refused
on the host, in one line naming the argument, before any launch, in a child under the suite's
limits. The well-formed call in the same child still runs and matches float64 autograd."""

import pytest

from .harness import refused_cheaply, run_snippet

BAD = [
    ('do', 'torch.randn(1, 1, 1, 1)'),                   # read B*H*N*D elements past a 1-element buffer
    ('lse', 'torch.randn(1, 1, 1)'),
    ('o', 'torch.randn(B, H, N, 1)'),
    ('o', 'torch.randn(B, H, N + 1, D)'),
    ('dlse', 'torch.randn(B, H, 1)'),
    ('do', 'torch.randn(B, H, N, D).to(torch.int32)'),   # an integer dO
    ('lse', '"lse"'),
    ('o', 'torch.randn(B, H, N, D, device="meta")'),     # another device
]

CODE = """
import torch
import kernels.backward_launch as kb
from kernels import flash_attention
from kernels.backward import flash_attention_backward
launches = []
real = kb._launch
kb._launch = lambda *a, **kw: (launches.append(a[0].__name__), real(*a, **kw))[1]
g = torch.Generator().manual_seed(0)
B, H, N, D = 1, 2, 32, 16
q, k, v, do = (torch.randn(B, H, N, D, generator=g) for _ in range(4))
o, lse = flash_attention(q, k, v, "causal", return_lse=True)
for name, bad in BAD:
    args = dict(do=do, q=q, k=k, v=v, o=o, lse=lse, dlse=None)
    args[name] = eval(bad)
    try:
        flash_attention_backward(args["do"], q, k, v, args["o"], args["lse"], "causal", dlse=args["dlse"])
        print("RAN", name, bad)
    except ValueError as exc:
        print("REFUSED", len(launches), str(exc).replace(chr(10), " "))
# the well-formed call still runs, and matches float64 autograd
q64, k64, v64 = (t.double().requires_grad_(True) for t in (q, k, v))
s = (q64 @ k64.transpose(-1, -2)) * D ** -0.5
s = s.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
(torch.softmax(s, -1) @ v64).backward(do.double())
grads = flash_attention_backward(do, q, k, v, o, lse, "causal")
errs = [((x.double() - r).norm() / r.norm()).item() for x, r in zip(grads, (q64.grad, k64.grad, v64.grad))]
print("REFUSED none; well-formed:", "OK" if max(errs) < 1e-5 else errs, len(launches))
"""


def test_backward_refuses_tensors_that_do_not_fit_before_any_launch():
    res = run_snippet(f"BAD = {BAD!r}" + CODE)
    last = refused_cheaply(res, "well-formed: OK 3")      # within the limits; the good call: preprocess, passes, finite-row twin
    lines = res.stdout.strip().splitlines()[-len(BAD) - 1:-1]
    assert last and len(lines) == len(BAD), res.stdout
    for (name, bad), line in zip(BAD, lines):
        # refused in one line naming the argument and the shape it must have, before any launch
        assert line.startswith(f"REFUSED 0 {name} must be") and "(1, 2, 32" in line, (bad, line)
