"""Host time of an untraced backward call, ours against SDPA's (benchmarks.overhead --parts backward).

At B1 H8 N1024 bf16, D 64 and D 128, causal and full (small calls, where the host time is most of
a training step's attention backward), host microseconds per call (benchmarks.overhead.host_us:
unsynchronised calls, the three taking turns in 5 rounds) of
  ours           flash_attention_backward(do, q, k, v, o, lse, mask) (the call the op runs);
  ours_autograd  torch.autograd.grad through flash_attention's output (retain_graph: the same graph
                 each call), what a training step pays;
  sdpa_autograd  the same through torch's scaled_dot_product_attention (its default backend);
and, of ours_autograd, how much of a call is our Python backward itself (in_backward_us: the median
time inside FlashAttentionFunction.backward, which the autograd engine runs on its device thread,
and in_backward_of_us: the median whole call over those same calls): the rest is the engine's."""

from __future__ import annotations

import sys

import torch

from . import log

SHAPES = ((1, 8, 1024, 64), (1, 8, 1024, 128))      # (B, H, N, D)
MAX_CALLS = 200     # calls per round: the GPU stays behind and the launch queue never fills


def backward_overhead(device, calls: int, host_us, profile: bool = False) -> list:
    """One record per (D, mask): host µs per call of ours, ours_autograd and sdpa_autograd.

    Arguments:
        device: torch.device (cpu: the interpreter, a smoke run of tiny shapes and 3 calls).
        calls: timed calls per round (at most MAX_CALLS); host_us: benchmarks.overhead.host_us.
        profile: print a cProfile of ours at D 128 causal to stderr.
    Returns:
        list of records."""
    from kernels import flash_attention
    from kernels.backward import backward_config, flash_attention_backward
    from kernels.gluon_bwd_launch import gluon_backward_fits

    shapes, dtype, rounds = SHAPES, torch.bfloat16, 5
    if device.type != "cuda":       # host times in the interpreter say nothing about a GPU
        shapes, dtype, rounds, calls = ((1, 2, 64, 32),), torch.float32, 1, 3
    calls = min(calls, MAX_CALLS)
    records = []
    for b, h, n, d in shapes:
        g = torch.Generator(device=device).manual_seed(0)
        q, k, v, do = (torch.randn(b, h, n, d, generator=g, device=device, dtype=dtype) for _ in range(4))
        for mask in ("causal", "full"):
            o, lse = flash_attention(q, k, v, mask, return_lse=True)
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            out_ours = flash_attention(*leaves, mask)
            out_sdpa = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=mask == "causal")
            fns = {"ours": lambda: flash_attention_backward(do, q, k, v, o, lse, mask),
                   "ours_autograd": lambda: torch.autograd.grad(out_ours, leaves, do, retain_graph=True),
                   "sdpa_autograd": lambda: torch.autograd.grad(out_sdpa, leaves, do, retain_graph=True)}
            cfg = backward_config(d, dtype, device)
            rec = {"mask": mask, "batch": b, "heads": h, "seq_len": n, "head_dim": d, "dtype": str(dtype),
                   "kernel": "gluon" if gluon_backward_fits(q, k, cfg, None) else "triton"}
            rec.update(host_us(fns, calls, device, rounds=rounds))
            rec["in_backward_us"], rec["in_backward_of_us"] = _time_inside_backward(fns["ours_autograd"], calls, device,
                                                                                    host_us)
            rec["ours_over_sdpa"] = rec["ours_autograd"]["median_us"] / rec["sdpa_autograd"]["median_us"]
            records.append(rec)
            log(f"backward {mask:6s} B{b} H{h} N{n} D{d} ({rec['kernel']}): ours {rec['ours']['median_us']:.1f} us, "
                f"through autograd {rec['ours_autograd']['median_us']:.1f} us (of {rec['in_backward_of_us']:.1f} in "
                f"other calls, {rec['in_backward_us']:.1f} inside our backward), SDPA through autograd "
                f"{rec['sdpa_autograd']['median_us']:.1f} us ({rec['ours_over_sdpa']:.2f}x)")
            if profile and mask == "causal" and d == 128:
                import cProfile
                import pstats

                prof = cProfile.Profile()
                prof.runcall(lambda: [fns["ours"]() for _ in range(calls)])
                pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(15)
    return records


def _time_inside_backward(fn, calls: int, device, host_us) -> tuple:
    """(median µs per call inside FlashAttentionFunction.backward, median µs per whole call) over the
    same `calls` unsynchronised calls of fn (an autograd.grad through flash_attention's output),
    timed as host_us times (one round after its warm-up calls); the inside timed where the engine
    runs it."""
    import statistics
    import time

    from kernels.flash_ops import FlashAttentionFunction

    real = FlashAttentionFunction.backward
    inside = []

    def timed(ctx, *grads):
        t0 = time.perf_counter_ns()
        result = real(ctx, *grads)
        inside.append(time.perf_counter_ns() - t0)
        return result
    FlashAttentionFunction.backward = staticmethod(timed)
    try:
        whole = host_us({"whole": fn}, calls, device, rounds=1)["whole"]["median_us"]
    finally:
        FlashAttentionFunction.backward = staticmethod(real)
    return statistics.median(inside[-calls:]) / 1e3, whole      # the timed calls, not the warm-up ones
