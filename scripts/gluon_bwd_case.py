"""One Gluon backward probe pass on one case, in its own process (a fault cannot poison other cases;
run it under compute-sanitizer to find one): prints OK and its relative errors against a float32
autograd reference, or the error.

    python scripts/gluon_bwd_case.py dkdv MASK H H_KV N_Q N_K D STAGES
    python scripts/gluon_bwd_case.py dq MASK H H_KV N_Q N_K D STAGES BLOCK_N
    python scripts/gluon_bwd_case.py fused MASK H H_KV N_Q N_K D STAGES [writer]
    compute-sanitizer --tool memcheck python scripts/gluon_bwd_case.py dkdv causal 2 2 256 256 128 2
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.gluon_backward import gluon_dkdv  # noqa: E402
from benchmarks.gluon_backward_dq import gluon_dq  # noqa: E402
from benchmarks.gluon_backward_fused import gluon_backward_fused  # noqa: E402
from kernels import flash_attention  # noqa: E402
from kernels.masks import parse_mask  # noqa: E402


def main(argv) -> int:
    which, mask = argv[0], argv[1]
    h, h_kv, n_q, n_k, d, stages = map(int, argv[2:8])
    torch.manual_seed(0)
    q, do = (torch.randn(1, h, n_q, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(1, h_kv, n_k, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    o, lse = flash_attention(q, k, v, mask=mask, return_lse=True)
    leaves = [t.float().requires_grad_(True) for t in (q, k, v)]
    lo, hi = (torch.from_numpy(a.astype("int64")).cuda() for a in parse_mask(mask, n_q, n_k).row_intervals(n_q, n_k))
    cols = torch.arange(n_k, device="cuda")
    visible = (cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None])
    s = leaves[0] @ leaves[1].repeat_interleave(h // h_kv, 1).transpose(-1, -2) / d ** 0.5
    probs = torch.softmax(s.masked_fill(~visible, float("-inf")), -1).nan_to_num()     # rows without keys: 0
    want = torch.autograd.grad(probs @ leaves[2].repeat_interleave(h // h_kv, 1), leaves, do.float())
    err = lambda x, r: float((x.float() - r).norm() / r.norm())  # noqa: E731
    if which == "dkdv":
        got = dict(zip(("dk", "dv"), gluon_dkdv(do, q, k, v, o, lse, mask, stages=stages)))
    elif which == "dq":
        got = dict(dq=gluon_dq(do, q, k, v, o, lse, mask, block_n=int(argv[8]), stages=stages))
    else:
        got = dict(zip(("dq", "dk", "dv"), gluon_backward_fused(do, q, k, v, o, lse, mask, stages=stages,
                                                                dq_writer=argv[8:9] == ["writer"])))
    torch.cuda.synchronize()
    ref = dict(zip(("dq", "dk", "dv"), want))
    print("OK", " ".join(argv), " ".join(f"{name} {err(x, ref[name]):.2e}" for name, x in got.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
