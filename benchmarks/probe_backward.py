"""The backward suites of benchmarks.kernel_probe: flash_attention_backward alone per
BackwardConfig variant (tiles, one or two launches, lse_acc, finite_rows, tma, dp_first,
split_dkdv), dQ by atomic adds (benchmarks.backward_atomic), and cuDNN's and FA2's backward through
SDPA (autograd.grad on a kept graph, the backward alone), all on the same inputs: q, k, v, dO
random bf16, O and lse from a float32 torch forward (no forward kernel to compile). Every variant
returns (dQ, dK, dV), checked against cuDNN's by kernel_probe, except the one-pass timings
(`only`: the dK/dV or the dQ launch alone, `nocheck`)."""

from __future__ import annotations

import torch

BWD_KINDS = ("bwd", "bwd_atomic", "cudnn_bwd", "fa2_bwd", "bwd_gluon_dkdv", "bwd_gluon_dq", "bwd_gluon_fused",
             "bwd_gluon_onepass", "bwd_gluon_d256")
BWD_SUITES = ("bwd256", "bwd128", "fwd4k", "bwdatomic", "bwdgluon", "bwdfused", "bwdonepass", "bwdd256", "bwdd64")
# D 256's tiles before split_dkdv became its default (64-row score dots, computed by both warpgroups)
OLD_256 = dict(block_m1=64, block_n1=64, block_m2=64, block_n2=64, split_dkdv=False)


def _bwd(shape, mask, label, cfg=None, kind="bwd"):
    return dict(kind=kind, shape=shape, mask=mask, label=label, bwd_cfg=cfg, cfg=None, ws=None, sched="natural",
                **{"pass": "bwd"})


def _label(change: dict) -> str:
    """A variant's label: its changed fields, the old D 256 tiles named once as '64x64'."""
    old = change.get("split_dkdv") is False
    rest = " ".join(f"{k}={v}" for k, v in change.items() if not (old and k in OLD_256 and OLD_256[k] == v))
    return ("64x64 " + rest).strip() if old else rest


def _forward_suite() -> list[dict]:
    """fwd4k: the forward, causal D 128 at 2k / 4k / 8k: the longest_first schedule and 64-row
    tiles, which the fwdcausal suite found faster than the default at 4k (kernel_probe's forward
    variants, kept here while kernel_probe.py is being extended elsewhere)."""
    out = []
    for n in (2048, 4096, 8192):
        shape = (4, 16, 16, n, 128)
        out.append(dict(kind="cudnn", shape=shape, mask="causal", label="cudnn"))
        for cfg in (None, (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3), (64, 64, 8, 3), (128, 64, 8, 3)):
            for sched in ("natural", "longest_first"):
                label = f"{'default' if cfg is None else f'plain {cfg}'}{', longest_first' if sched != 'natural' else ''}"
                out.append(dict(kind="fwd", shape=shape, mask="causal", cfg=cfg, ws=None if cfg is None else False,
                                label=label, sched=sched))
    return out


def backward_suite(name: str) -> list[dict]:
    """The variants of a backward suite: dicts of kind, shape (B, H, H_kv, N, D), mask, bwd_cfg
    (BackwardConfig fields as a dict, None: the default) and label."""
    from kernels.backward import CUDA_CONFIGS

    out = []
    if name == "fwd4k":
        return _forward_suite()
    if name == "bwdatomic":
        return _atomic_suite()
    if name == "bwdgluon":
        return _gluon_suite()
    if name == "bwdfused":
        return _fused_suite()
    if name == "bwdonepass":
        return _onepass_suite()
    if name == "bwdd256":
        return _d256_onepass_suite(variants=True)
    if name == "bwdd64":
        return _d64_onepass_suite()
    if name == "bwd256":
        # the default splits dK/dV (dV and dK programs of 128 keys, dQ 128 x 32): the old 64 x 64
        # tiles and the split's neighbours beside it
        d, cases = 256, [((4, 16, 16, 4096, 256), m) for m in ("causal", "full")]
        old = OLD_256
        extra = [old, dict(old, block_m2=128, block_n2=32), dict(one_launch=False, tma=True),
                 dict(block_m1=16, num_stages=3), dict(block_m1=16, num_stages=3, tma=True), dict(dp_first=True)]
        only = [("64x64", old)]
    else:
        d = 128
        cases = [((4, 16, 16, 4096, 128), m) for m in ("causal", "full")] + [((2, 32, 8, 8192, 128), "causal")]
        extra = [dict(block_n2=128, num_stages=2), dict(num_stages=4), dict(tma=True, lse_acc=True),
                 dict(tma=True, num_stages=4), dict(dp_first=True), dict(tma=True, dp_first=True),
                 dict(split_dkdv=True)]
        only = []
    base = CUDA_CONFIGS[d].__dict__
    for shape, mask in cases:
        out.append(_bwd(shape, mask, "cudnn", kind="cudnn_bwd"))
        out.append(_bwd(shape, mask, "fa2 sdpa", kind="fa2_bwd"))
        out.append(_bwd(shape, mask, "default"))
        for change in [dict(tma=True), dict(finite_rows=False), dict(lse_acc=True), dict(one_launch=False)] + extra:
            out.append(_bwd(shape, mask, _label(change), dict(base, **change)))
        if d != 256:        # the atomic kernel's D 256 tiles do not fit shared memory
            out.append(_bwd(shape, mask, "dq atomic, default tiles", kind="bwd_atomic"))
        # one pass alone (and the preprocess), two launches: outputs not checked
        for name, change in [("default", {})] + only:
            cfg = dict(base, **change, one_launch=False)
            for part in ("dkdv", "dq"):
                out.append(dict(_bwd(shape, mask, f"{name}: {part} pass only", cfg), only=part, nocheck=True))
    return out


def _atomic_suite() -> list[dict]:
    """bwdatomic: dQ by atomic adds from the dK/dV programs (5 tile products per visible tile, not
    the separate dQ pass's 7), each tile's dQ as per-element atomics or as one TMA bulk reduce-add
    (dq_tma), at the default tiles and neighbours that fit shared memory, beside the default."""
    from kernels.backward import CUDA_CONFIGS

    out = []
    cases = [((4, 16, 16, n, 128), m) for n in (4096, 8192) for m in ("causal", "full")] + \
        [((2, 32, 8, 8192, 128), "causal"), ((4, 16, 16, 8192, 64), "causal"), ((4, 16, 16, 8192, 64), "full"),
         ((4, 16, 16, 4096, 256), "causal")]
    for shape, mask in cases:
        d = shape[-1]
        base = CUDA_CONFIGS[d].__dict__
        out.append(_bwd(shape, mask, "cudnn", kind="cudnn_bwd"))
        out.append(_bwd(shape, mask, "fa2 sdpa", kind="fa2_bwd"))
        out.append(_bwd(shape, mask, "default"))
        tiles = {128: [dict(), dict(num_stages=2)], 64: [dict(), dict(block_m1=64, num_warps=8)],
                 256: [dict(block_m1=32, block_n1=64, split_dkdv=False)]}[d]
        for change in tiles:
            for tma in (False, True):
                label = f"dq {'tma' if tma else 'atomic'} {_label(change) or 'default tiles'}"
                out.append(dict(_bwd(shape, mask, label, dict(base, **change), kind="bwd_atomic"), dq_tma=tma))
    return out


def _gluon_suite() -> list[dict]:
    """bwdgluon: the fused Gluon backward (benchmarks.gluon_backward_fused), the Gluon dK/dV and dQ
    passes (benchmarks.gluon_backward) against the Triton kernel's passes alone (two launches, one
    left out, the rows "default: <pass> pass only"), the whole default backward (on Hopper at D 128
    the Gluon passes), the Triton kernel's whole backward, cuDNN's and FA2's;
    the pass-only rows are timed, not checked (tests/benchmarks/test_backward_bench.py checks the
    Gluon pass against float64 on the GPU)."""
    from kernels.backward import CUDA_CONFIGS

    out = []
    cases = [((4, 16, 16, n, 128), m) for n in (4096, 8192) for m in ("causal", "full")] + \
        [((2, 32, 8, 8192, 128), "causal")] + [((4, 16, 16, n, 64), m) for n, m in ((4096, "causal"), (8192, "causal"),
                                                                             (8192, "full"))]
    for shape, mask in cases:
        base = CUDA_CONFIGS[shape[-1]].__dict__
        out.append(_bwd(shape, mask, "cudnn", kind="cudnn_bwd"))
        out.append(_bwd(shape, mask, "fa2 sdpa", kind="fa2_bwd"))
        out.append(_bwd(shape, mask, "default"))            # the product: on Hopper at D 128 the Gluon passes
        out.append(_bwd(shape, mask, "triton kernel", base))
        for part in ("dkdv", "dq"):
            out.append(dict(_bwd(shape, mask, f"default: {part} pass only", dict(base, one_launch=False)), only=part,
                            nocheck=True))
        # the whole backward in one Gluon kernel (dQ by atomics; D 128 fits 2 stages): checked against cuDNN
        for writer in (False, True):
            out.append(dict(_bwd(shape, mask, f"gluon fused, dq by {'a writer warp' if writer else 'the consumers'}",
                                 kind="bwd_gluon_fused"), stages=2, dq_writer=writer))
        # the same with dQ stored, not added (wrong dQ: timed, not checked): what the atomics cost
        out.append(dict(_bwd(shape, mask, "gluon fused, dq stored (ablation)", kind="bwd_gluon_fused"), stages=2,
                        dq_writer=False, dq_store=True, nocheck=True))
        out.append(dict(_bwd(shape, mask, "gluon fused, dq by the consumers, stats by TMA", kind="bwd_gluon_fused"),
                        stages=2, dq_writer=False, stats_tma=True))
        out.append(dict(_bwd(shape, mask, "gluon fused, dq by TMA reduce-adds, stats by TMA", kind="bwd_gluon_fused"),
                        stages=2, dq_writer=False, stats_tma=True, dq_tma=True))
        for stages in (2, 3):
            out.append(dict(_bwd(shape, mask, f"gluon dkdv pass, {stages} stages", kind="bwd_gluon_dkdv"),
                            stages=stages, nocheck=True))
            # the tiles' statistics by TMA into each stage (FlashAttention-3's way), not 32 loads a thread
            out.append(dict(_bwd(shape, mask, f"gluon dkdv pass, {stages} stages, stats by TMA",
                                 kind="bwd_gluon_dkdv"), stages=stages, stats_tma=True, nocheck=True))
            for block_n in (64, 128) if stages == 2 or shape[-1] == 64 else (64,):   # 3 x 128 x 128 > 227 KiB
                out.append(dict(_bwd(shape, mask, f"gluon dq pass, 128x{block_n}, {stages} stages",
                                     kind="bwd_gluon_dq"), stages=stages, block_n=block_n, nocheck=True))
    return out


def _fused_suite() -> list[dict]:
    """bwdfused: the fused Gluon backward's ways of adding dQ (the consumers' atomics, one TMA bulk
    reduce-add per tile and group, and the ablation that stores it), each tile's dQ product right
    after the group's dK, dV or a tile late (dq_late), beside the default (on Hopper at D 128 the
    Gluon passes) and cuDNN, at D 128: bwdgluon's fused rows in a few minutes."""
    out = []
    for shape, mask in [((4, 16, 16, 4096, 128), "causal"), ((4, 16, 16, 8192, 128), "causal"),
                        ((4, 16, 16, 4096, 128), "full"), ((2, 32, 8, 8192, 128), "causal")]:
        out += [_bwd(shape, mask, "cudnn", kind="cudnn_bwd"), _bwd(shape, mask, "default")]
        for label, how in (("by atomics", {}), ("by TMA reduce-adds", dict(dq_tma=True)),
                           ("stored (ablation)", dict(dq_store=True, nocheck=True)),
                           ("by atomics a tile late", dict(dq_late=True)),
                           ("by TMA reduce-adds a tile late", dict(dq_tma=True, dq_late=True))):
            out.append(dict(_bwd(shape, mask, f"gluon fused, dq {label}, stats by TMA", kind="bwd_gluon_fused"),
                            stages=2, dq_writer=False, stats_tma=True, **how))
    return out


def _d256_onepass_suite(variants: bool = False) -> list[dict]:
    """bwdonepass's first rows: at D 256 the default beside the D 256 one pass launched alone
    (benchmarks.gluon_backward_d256) and cuDNN; with variants (bwdd256) also the one pass with one
    dO stage (64-column dQ buffers; the product: two, 32 columns), with one dO stage and two P / dS
    buffers, and at 240 consumer registers (the D 128 kernel's; the D 256 kernel's own: 232)."""
    out = []
    for shape, mask in [((4, 16, 16, 4096, 256), "causal"), ((4, 16, 16, 4096, 256), "full"),
                        ((4, 16, 16, 8192, 256), "causal")]:
        out += [_bwd(shape, mask, "cudnn", kind="cudnn_bwd"), _bwd(shape, mask, "default"),
                _bwd(shape, mask, "gluon D 256 one pass", kind="bwd_gluon_d256")]
        if variants:
            out += [dict(_bwd(shape, mask, "one pass, 1 dO stage, dQ by 64 columns", kind="bwd_gluon_d256"),
                         do_stages=1, dq_cols=64),
                    dict(_bwd(shape, mask, "one pass, 1 dO stage, 2 P/dS buffers", kind="bwd_gluon_d256"),
                         do_stages=1, dq_cols=64, pds_buffers=2),
                    dict(_bwd(shape, mask, "one pass, 240 registers", kind="bwd_gluon_d256"), consumer_regs=240)]
    return out


def _d64_onepass_suite() -> list[dict]:
    """bwdd64: at D 64 (full and causal, 4k and 8k) the default (the one pass in 128-row tiles,
    each consumer group's dQ over all of D for half the tile's rows) beside the same launched alone,
    and with each group's dQ over half of D for all the rows (wgmma N = 32, not 64: dq_by_rows
    False), and cuDNN."""
    out = []
    for shape, mask in [((4, 16, 16, n, 64), m) for m in ("full", "causal") for n in (4096, 8192)]:
        out += [_bwd(shape, mask, "cudnn", kind="cudnn_bwd"), _bwd(shape, mask, "default"),
                dict(_bwd(shape, mask, "gluon one pass, 128-row tiles", kind="bwd_gluon_onepass"), stages=2, rows=128),
                dict(_bwd(shape, mask, "one pass, 128-row tiles, dQ by columns", kind="bwd_gluon_onepass"), stages=2,
                     rows=128, dq_by_rows=False)]
    return out


def _onepass_suite() -> list[dict]:
    """bwdonepass: the default (the one-pass Gluon kernel at D 128 on Hopper) beside the two Gluon
    passes (what deterministic calls run), the one pass launched alone (benchmarks.gluon_backward_onepass)
    in the product's program order and head after head, and cuDNN, at D 128; at D 64 the default
    beside the one pass in 64- and 128-row tiles; at D 256 the default (the Triton kernel) beside
    the D 256 one pass launched alone (benchmarks.gluon_backward_d256)."""
    out = _d256_onepass_suite()
    d64 = [((4, 16, 16, n, 64), mask) for mask in ("full", "causal") for n in (4096, 8192, 16384)]
    for shape, mask in [((4, 16, 16, 4096, 128), "causal"), ((4, 16, 16, 8192, 128), "causal"),
                        ((4, 16, 16, 16384, 128), "causal"), ((4, 16, 16, 4096, 128), "full"),
                        ((4, 16, 16, 8192, 128), "full"), ((2, 32, 8, 8192, 128), "causal")] + d64:
        out += [_bwd(shape, mask, "cudnn", kind="cudnn_bwd"), _bwd(shape, mask, "default")]
        if shape[-1] == 128:
            out.append(dict(_bwd(shape, mask, "two Gluon passes (deterministic)"), two_pass=True))
        if shape[-1] == 128:    # the order the programs took before program_head_groups
            out.append(dict(_bwd(shape, mask, "gluon one pass, head after head", kind="bwd_gluon_onepass"),
                            stages=2, head_major=True))
        out.append(dict(_bwd(shape, mask, "gluon one pass", kind="bwd_gluon_onepass"), stages=2))
        if shape[-1] == 64:     # FlashAttention-3's D 64 tile
            out.append(dict(_bwd(shape, mask, "gluon one pass, 128-row tiles", kind="bwd_gluon_onepass"),
                            stages=2, rows=128))
    return out


_CACHE: dict = {}


def _forward(q, k, v, causal: bool, heads: int = 8):
    """O (q's dtype) and the natural-log lse (float32) in float32 torch arithmetic, a few heads at a
    time: the backward's inputs without compiling a forward kernel."""
    group = q.shape[1] // k.shape[1]
    o, lse = torch.empty_like(q), torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    n_q, n_k = q.shape[2], k.shape[2]
    hidden = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).triu(n_k - n_q + 1) if causal else None
    for bi in range(q.shape[0]):
        for h0 in range(0, q.shape[1], heads):
            hs = slice(h0, h0 + heads)
            kk = k[bi].repeat_interleave(group, 0)[hs].float()
            vv = v[bi].repeat_interleave(group, 0)[hs].float()
            s = q[bi, hs].float() @ kk.transpose(-1, -2) * q.shape[-1] ** -0.5
            if hidden is not None:
                s.masked_fill_(hidden, float("-inf"))
            lse[bi, hs] = torch.logsumexp(s, -1)
            o[bi, hs] = (torch.softmax(s, -1) @ vv).to(q.dtype)
    return o, lse


def _tensors(v, device):
    """q, k, v, dO (bf16, seeded by the shape) and the forward's O and lse; one case kept at a time."""
    b, h, h_kv, n, d = v["shape"]
    key = (tuple(v["shape"]), v["mask"])
    if key not in _CACHE:
        _CACHE.clear()
        g = torch.Generator(device=device).manual_seed(n + d + 1)
        q = torch.randn(b, h, n, d, generator=g, device=device, dtype=torch.bfloat16)
        k, vv = (torch.randn(b, h_kv, n, d, generator=g, device=device, dtype=torch.bfloat16) for _ in range(2))
        do = torch.randn(b, h, n, d, generator=g, device=device, dtype=torch.bfloat16)
        with torch.no_grad():
            o, lse = _forward(q, k, vv, v["mask"] == "causal")
        _CACHE[key] = (q, k, vv, do, o, lse)
    return _CACHE[key]


def backward_call(v, device):
    """fn() of a backward variant, returning (dQ, dK, dV)."""
    from kernels.backward import BackwardConfig, flash_attention_backward

    q, k, vv, do, o, lse = _tensors(v, device)
    mask = v["mask"]
    if v["kind"] in ("cudnn_bwd", "fa2_bwd"):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = SDPBackend.CUDNN_ATTENTION if v["kind"] == "cudnn_bwd" else SDPBackend.FLASH_ATTENTION
        leaves = [t.detach().requires_grad_(True) for t in (q, k, vv)]
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=mask == "causal",
                                                                   enable_gqa=True)
        return lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)
    if v["kind"] == "bwd_gluon_dkdv":
        from .gluon_backward import gluon_dkdv

        return lambda: gluon_dkdv(do, q, k, vv, o, lse, mask, stages=v["stages"], stats_tma=v.get("stats_tma", False))
    if v["kind"] == "bwd_gluon_fused":
        from .gluon_backward_fused import gluon_backward_fused

        return lambda: gluon_backward_fused(do, q, k, vv, o, lse, mask, stages=v["stages"], dq_writer=v["dq_writer"],
                                            dq_store=v.get("dq_store", False), stats_tma=v.get("stats_tma", False),
                                            dq_tma=v.get("dq_tma", False), dq_late=v.get("dq_late", False))
    if v["kind"] == "bwd_gluon_onepass":
        from .gluon_backward_onepass import gluon_backward_onepass

        groups = q.shape[0] * vv.shape[1] if v.get("head_major") else None     # head after head, or the product's
        return lambda: gluon_backward_onepass(do, q, k, vv, o, lse, mask, stages=v["stages"], head_groups=groups,
                                              rows=v.get("rows", 64), dq_by_rows=v.get("dq_by_rows"))
    if v["kind"] == "bwd_gluon_d256":
        from .gluon_backward_d256 import gluon_backward_d256

        how = {n: v[n] for n in ("consumer_regs", "do_stages", "pds_buffers", "dq_cols") if n in v}
        return lambda: gluon_backward_d256(do, q, k, vv, o, lse, mask, **how)
    if v["kind"] == "bwd_gluon_dq":
        from .gluon_backward_dq import gluon_dq

        return lambda: gluon_dq(do, q, k, vv, o, lse, mask, block_n=v["block_n"], stages=v["stages"])
    if v["kind"] == "bwd_atomic":
        from .backward_atomic import flash_attention_backward_atomic

        cfg = None if v["bwd_cfg"] is None else BackwardConfig(**v["bwd_cfg"])
        return lambda: flash_attention_backward_atomic(do, q, k, vv, o, lse, mask, config=cfg,
                                                       dq_tma=v.get("dq_tma", False))
    cfg = None if v["bwd_cfg"] is None else BackwardConfig(**v["bwd_cfg"])
    if v.get("only"):
        return _one_pass(v["only"], lambda: flash_attention_backward(do, q, k, vv, o, lse, mask, config=cfg))
    if v.get("two_pass"):
        return _two_passes(lambda: flash_attention_backward(do, q, k, vv, o, lse, mask, config=cfg))
    return lambda: flash_attention_backward(do, q, k, vv, o, lse, mask, config=cfg)


def _two_passes(call):
    """call() with the Gluon backward as its two passes (TILESCOPE_BWD_ONEPASS=0 while it runs)."""
    import os

    def run():
        old = os.environ.get("TILESCOPE_BWD_ONEPASS")
        os.environ["TILESCOPE_BWD_ONEPASS"] = "0"
        try:
            return call()
        finally:
            if old is None:
                del os.environ["TILESCOPE_BWD_ONEPASS"]
            else:
                os.environ["TILESCOPE_BWD_ONEPASS"] = old
    return run


def _one_pass(only: str, call):
    """call() with the main kernel launched for one pass only ('dkdv' or 'dq'; two-launch configs)."""
    import kernels.backward_launch as B

    orig = B._launch

    def launch(kernel, grid, args, cfg=None):
        if kernel is B.attn_bwd_kernel and bool(args["DKDV"]) != (only == "dkdv"):
            return
        orig(kernel, grid, args, cfg)

    def fn():
        B._launch = launch
        try:
            return call()
        finally:
            B._launch = orig
    return fn
