"""The precision study: one input preset run through the four forward variants -- our bf16 kernel,
FP8 with one scale per tensor, FP8 with one scale per tile, and FP8 per tile after a Hadamard
rotation of Q and K -- each compared with ONE float64 reference computed where the run happens
(on the GPU for a GPU run), timed on CUDA, and saved as one recording the "Low precision" page reads.

    python -m instrumentation.precision_study --preset fa3_outliers --out data/precision/NAME

    from instrumentation.precision_study import run_study, study_inputs, PRESETS, VARIANTS
    trace = run_study("fa3_outliers_small")        # a Trace: work (the bf16 run's items), fp8_error
    trace.fp8_error                                 # bh, q_block, rmse, max_abs, variant (all four)
    trace.meta["precision_study"]["variants"]       # per variant: rmse, max_abs, times, TFLOP/s

FA3's outlier recipe (the FlashAttention-3 paper's accuracy test): Q, K, V standard normal with
0.1% of the entries multiplied by 10. Timings are Triton do_bench medians of the untraced calls
(instrumentation.recording.timing.time_ms); an interpreter run has none (null), never modelled.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import asdict, dataclass

from .analysis.precision_error import reference_fp64  # noqa: F401  (re-exported: the study's reference)

PROG = "python -m instrumentation.precision_study"
OUTLIER_FRACTION = 1e-3          # FA3: 0.1% of the entries ...
OUTLIER_SCALE = 10.0             # ... of magnitude 10
# name -> (what the page calls it, flash_attention_fp8 arguments or None for the bf16 kernel)
VARIANTS = {
    "bf16": ("bf16 (our flash_attention)", None),
    "fp8_tensor": ("FP8 per-tensor", dict(scaling="tensor", hadamard=False)),
    "fp8_block": ("FP8 block", dict(scaling="block", hadamard=False)),
    "fp8_block_hadamard": ("FP8 block + Hadamard", dict(scaling="block", hadamard=True)),
}


@dataclass(frozen=True)
class StudyPreset:
    """One input problem of the study: shape, mask, whether FA3's outliers are in, and where it runs."""
    name: str
    label: str
    batch: int
    heads: int
    kv_heads: int
    n: int
    head_dim: int
    mask: str
    outliers: bool
    gpu: bool                 # a GPU-sized problem (the interpreter refuses it by arithmetic)
    block_m: int | None = None    # the bf16 kernel's tiles and the error maps' query blocks (None: its default)


def _model_preset(name: str, size: str, batch: int, n: int, outliers: bool, gpu: bool, max_heads=None):
    from kernels.presets import preset

    p = preset("llama-3-8b")
    if max_heads:
        p = p.scaled(max_heads=max_heads)
    recipe = "FA3 outliers" if outliers else "normal"
    return StudyPreset(name, f"{p.label.split(' (')[0]} shape (H {p.heads}/{p.kv_heads}, D {p.head_dim}), "
                       f"{size}, {recipe}", batch, p.heads, p.kv_heads, n, p.head_dim, p.mask(), outliers, gpu,
                       None if gpu else 32)


def _presets() -> dict:
    out = [StudyPreset("fa3_outliers", "FA3 outlier recipe, B4 H16 N4096 D128, full", 4, 16, 16, 4096, 128,
                       "full", True, True),
           StudyPreset("normal", "standard normal, B4 H16 N4096 D128, full", 4, 16, 16, 4096, 128, "full",
                       False, True),
           _model_preset("llama3_8b_outliers", "B1 N4096 causal", 1, 4096, True, True),
           StudyPreset("fa3_outliers_small", "FA3 outlier recipe, B1 H4 N512 D64, full (interpreter size)",
                       1, 4, 4, 512, 64, "full", True, False, 64),
           StudyPreset("normal_small", "standard normal, B1 H4 N512 D64, full (interpreter size)",
                       1, 4, 4, 512, 64, "full", False, False, 64),
           _model_preset("llama3_8b_outliers_small", "B1 N256 causal, interpreter size", 1, 256, True, False,
                         max_heads=4)]
    return {p.name: p for p in out}


PRESETS = _presets()


def get_preset(name) -> StudyPreset:
    """The preset called `name` (a StudyPreset passes through). Raises ValueError (one line, the
    names) for any other."""
    if isinstance(name, StudyPreset):
        return name
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"unknown preset {str(name)[:40]!r}; use one of {', '.join(PRESETS)}")
    return PRESETS[name]


def study_inputs(p: StudyPreset, seed: int = 0, device="cpu"):
    """(q, k, v) in bf16 on `device`: standard normal from a CPU generator seeded `seed` (the same
    values on every machine), with FA3's outliers (0.1% of the entries x 10) when p.outliers.
    q (B, H, N, D); k, v (B, H_kv, N, D)."""
    import torch

    gen = torch.Generator().manual_seed(int(seed))
    out = []
    for heads in (p.heads, p.kv_heads, p.kv_heads):
        x = torch.randn(p.batch, heads, p.n, p.head_dim, generator=gen)
        if p.outliers:
            x = torch.where(torch.rand(x.shape, generator=gen) < OUTLIER_FRACTION, x * OUTLIER_SCALE, x)
        out.append(x.to(device=device, dtype=torch.bfloat16))
    return tuple(out)


def _variant_call(name: str, q, k, v, mask: str):
    """A call without arguments running variant `name` (untraced) on q, k, v."""
    from kernels import flash_attention
    from kernels.fp8 import flash_attention_fp8

    fp8 = VARIANTS[name][1]
    if fp8 is None:
        return lambda: flash_attention(q, k, v, mask=mask)
    return lambda: flash_attention_fp8(q, k, v, mask=mask, **fp8)


def _quantise_call(name: str, q, k, v, mask: str):
    """A call running variant `name`'s quantise(-and-rotate) pass alone, at the tiles (and V^T
    order) the variant's call on `mask` takes, or None (bf16 has none)."""
    from kernels.fp8_quant import quantize_fp8

    fp8 = VARIANTS[name][1]
    if fp8 is None:
        return None
    return lambda: quantize_fp8(q, k, v, mask=mask, **fp8)


def _error_sources(name: str, q, k, v, mask: str, ref) -> dict:
    """Where an FP8 variant's error comes from, in float64: the RMSE against `ref` of exact
    attention on the quantised (and rotated) Q and K with exact V (the Q·Kᵀ inputs alone), and on
    exact Q, K with the quantised V (the P·V input alone). What the kernel adds beyond these is P's
    own e4m3 rounding and fp32 accumulation. {} for bf16."""
    from kernels.fp8_quant import dequantize_fp8, quantize_fp8

    fp8 = VARIANTS[name][1]
    if fp8 is None:
        return {}
    qd, kd, vd = dequantize_fp8(quantize_fp8(q, k, v, **fp8))
    d = q.shape[-1]
    qk = reference_fp64(qd, kd, v, mask, sm_scale=d ** -0.5)
    qk_rmse = float((qk - ref).pow(2).mean().sqrt())
    del qk
    pv = reference_fp64(q, k, vd[..., :d], mask)
    return {"rmse_qk_inputs": qk_rmse, "rmse_v_input": float((pv - ref).pow(2).mean().sqrt())}


def _timings(name: str, q, k, v, mask: str, flops: int) -> dict:
    """do_bench medians (ms) of the variant's whole call, of its quantise pass and of its attention
    kernel alone (kernels.fp8.attention_fp8 on inputs quantised once), and TFLOP/s of both."""
    from .recording.timing import time_ms

    total = time_ms(_variant_call(name, q, k, v, mask), q.device)
    quant = _quantise_call(name, q, k, v, mask)
    if quant is None:                         # bf16: one kernel, no quantise pass
        quant_ms, attn = 0.0, total
    else:
        from kernels.fp8 import attention_fp8

        quant_ms = time_ms(quant, q.device)
        x = quant()
        attn = time_ms(lambda: attention_fp8(x, mask=mask), q.device)
    return {"total_ms": total, "quantise_ms": quant_ms, "attention_ms": attn,
            "tflops_total": flops / total / 1e9, "tflops_attention": flops / attn / 1e9}


def run_study(preset: str, seed: int = 0, measure: bool = True, progress=None, command: str | None = None):
    """Run preset `preset` through the four variants on this machine's backend (CUDA when
    kernels.backend() says so, else the Triton interpreter).

    Arguments: preset, a name in PRESETS (or a StudyPreset); seed, the inputs' seed; measure, time each variant on
    CUDA (ignored in the interpreter: no timings there); progress, a function of one line (or
    None); command, the command line to store in the meta.
    Returns: a Trace: the bf16 kernel's work items (record(level='work')), the table fp8_error
    (bh, q_block, rmse, max_abs, variant) of all four variants against the one float64 reference,
    rows grouped by the trace's block_m, and meta['precision_study'] (preset, inputs, reference,
    per variant: rmse, max_abs and, on CUDA, times and TFLOP/s). Raises ValueError (one line).
    """
    import pandas as pd
    import torch

    from kernels import backend
    from kernels.masks import parse_mask

    from .analysis.precision_error import error_table
    from .recording import record

    say = progress or (lambda line: None)
    p = get_preset(preset)
    cuda = backend() == "cuda"
    if p.gpu and not cuda:
        small = [n for n, x in PRESETS.items() if not x.gpu]
        raise ValueError(f"preset {p.name} is GPU-sized (B{p.batch} H{p.heads} N{p.n} D{p.head_dim}); the CPU "
                         f"interpreter takes one of {', '.join(small)}, or run on a GPU")
    device = "cuda" if cuda else "cpu"
    started = time.perf_counter()
    say(f"[1/4] inputs: {p.label}, seed {seed}, on {device}")
    q, k, v = study_inputs(p, seed, device)
    say("[2/4] float64 reference on " + device)
    ref = reference_fp64(q, k, v, p.mask)
    flops = 4 * p.batch * p.heads * p.head_dim * parse_mask(p.mask, p.n, p.n).visible_pairs(p.n, p.n)
    meta_extra = {"input_seed": int(seed), "inputs": f"instrumentation.precision_study.study_inputs({p.name!r})"}
    if command:
        meta_extra["command"] = command
    out, trace = record(q, k, v, mask=p.mask, block_m=p.block_m, block_n=p.block_m, level="work", measure=False,
                        meta_extra=meta_extra)
    block_m = int(trace.meta["block_m"])
    tables, variants = [], {}
    for i, name in enumerate(VARIANTS):
        say(f"[3/4] variant {i + 1}/{len(VARIANTS)}: {VARIANTS[name][0]}")
        o = out if name == "bf16" else _variant_call(name, q, k, v, p.mask)()
        tables.append(error_table(o, ref, block_m, name))
        diff = o.double() - ref
        variants[name] = {"label": VARIANTS[name][0], "rmse": float(diff.pow(2).mean().sqrt()),
                          "max_abs": float(diff.abs().max()), **(VARIANTS[name][1] or {}),
                          **_error_sources(name, q, k, v, p.mask, ref)}
        if cuda and measure:
            variants[name].update(_timings(name, q, k, v, p.mask, flops))
        del o, diff
    trace.fp8_error = pd.concat(tables, ignore_index=True)
    trace.meta["precision_study"] = {
        "preset": p.name, "preset_label": p.label, "problem": asdict(p), "seed": int(seed),
        "inputs": ("standard normal, 0.1% of the entries x 10 (FA3's outlier recipe)" if p.outliers
                   else "standard normal") + ", bf16",
        "reference": f"float64 on {device}, computed once from the bf16 inputs",
        "source": "live GPU" if cuda else "Triton CPU interpreter (no timings)",
        "timed": bool(cuda and measure), "flops": int(flops), "error_block_m": block_m,
        "timing": "Triton do_bench medians of the untraced calls: the whole call, the quantise pass, and the "
                  "attention kernel on inputs quantised once"
                  if cuda and measure else None,
        "variants": variants, "wall_s": round(time.perf_counter() - started, 3)}
    say(f"[4/4] done in {time.perf_counter() - started:.1f} s")
    return trace


def summary_lines(trace) -> list[str]:
    """One line per variant: RMSE, max |error| and, when timed, ms and TFLOP/s."""
    lines = []
    for name, v in trace.meta["precision_study"]["variants"].items():
        t = (f"  {v['total_ms']:.3f} ms total ({v['quantise_ms']:.3f} quantise), {v['tflops_total']:.0f} TFLOP/s "
             f"total, {v['tflops_attention']:.0f} attention" if "total_ms" in v else "")
        lines.append(f"{v['label']:<28} RMSE {v['rmse']:.3e}  max|err| {v['max_abs']:.3e}{t}")
    return lines


def build_parser() -> argparse.ArgumentParser:
    from .cli.args import MAX_SEED, OneLineParser, bounded_int

    p = OneLineParser(prog=PROG, description="Run one input preset through bf16 and the three FP8 variants; "
                      "save errors against a float64 reference (and, on a GPU, timings) as one recording.")
    p.add_argument("--preset", required=True, choices=list(PRESETS),
                   help="; ".join(f"{n}: {x.label}" for n, x in PRESETS.items()))
    p.add_argument("--out", required=True, help="directory to write the recording into (data/precision/NAME)")
    p.add_argument("--seed", type=bounded_int(0, MAX_SEED), default=0)
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"],
                   help="cpu runs the Triton interpreter; auto picks cuda when available")
    p.add_argument("--no-measure", action="store_true", help="skip the timings (GPU)")
    p.add_argument("--force", action="store_true", help="replace an existing recording at --out")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def main(argv=None) -> int:
    """The command line: 0, or 2 with one 'error: ...' line on stderr."""
    from .cli.args import run_guarded

    args = build_parser().parse_args(argv)
    return run_guarded(_main, args, argv)


def _main(args, argv) -> int:
    from .cli.args import refuse, start_device
    from .cli.flash import is_trace_dir
    from .trace.files import check_dir_target

    p = PRESETS[args.preset]

    def preflight():
        check_dir_target(args.out, is_trace_dir, args.force, "trace")
        if p.gpu and args.device == "cpu":
            raise ValueError(f"preset {p.name} is GPU-sized; the interpreter (--device cpu) takes "
                             + ", ".join(n for n, x in PRESETS.items() if not x.gpu))

    problem = start_device(args.device, preflight)
    if problem:
        return refuse(problem)
    import torch

    command = f"{PROG} " + shlex.join(argv if argv is not None else sys.argv[1:])
    say = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        trace = run_study(args.preset, seed=args.seed, measure=not args.no_measure, progress=say, command=command)
        path = trace.save(args.out, force=args.force)
    except torch.cuda.OutOfMemoryError:
        return refuse("the GPU ran out of memory; use a smaller preset", 3)
    print(f"{trace.meta['device_name']} [{trace.meta['backend']}] {PRESETS[args.preset].label}")
    print("\n".join(summary_lines(trace)))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
