"""record(..., precision="fp8"): the FP8 kernel (kernels.fp8) traced as the bf16 one, so every page
that draws a trace draws it, plus the table fp8_error against a float64 reference computed where
the run happens (on the GPU for a GPU run).

instrumentation.recording.flash.record dispatches here for its checks and kernel call
(fp8_recording) and calls back once the trace is built (Fp8Recording.finish): the inputs are
quantised once (kernels.fp8_quant.quantize_fp8) and every traced or timed launch is the attention
kernel alone on them; the quantise pass is timed apart (meta['fp8']['quantise_ms']).
"""

from __future__ import annotations

from dataclasses import dataclass

from kernels.fp8 import attention_fp8
from kernels.fp8_quant import check_fp8_args, fp8_config, quantize_fp8
from kernels.launch_config import KernelConfig
from kernels.masks import parse_mask
from kernels.runtime import interpreting
from kernels.sizes import call_size

from ..analysis.precision_error import error_table, fp8_variant, reference_fp64
from .timing import time_ms

PRECISIONS = ("bf16", "fp8")


@dataclass
class Fp8Recording:
    """What record needs for an FP8 run: the mask, the tile config, the kernel call on the
    quantised inputs, and what finish adds to the trace."""

    spec: object
    cfg: KernelConfig
    inputs: tuple              # (q, k, v) as given
    x: object                  # kernels.fp8_quant.Fp8Inputs
    sm_scale: float | None
    scaling: str
    hadamard: bool

    @property
    def schedule(self) -> str:
        """The schedule the kernel runs: 'persistent' where the Gluon kernel does (one program per
        SM, each with its list of work items: kernels.gluon_fp8_launch), else 'natural'."""
        from kernels.gluon_fp8_launch import GLUON_FP8

        tiles = GLUON_FP8.get(self.x.head_dim_padded)
        return "persistent" if self.x.gluon and tiles is not None and tiles.persistent else "natural"

    def run(self, trace=None, return_lse=False):
        """The attention kernel on the quantised inputs (record's traced and timed launches)."""
        return attention_fp8(self.x, self.spec, self.sm_scale, return_lse, trace)

    def finish(self, trace, out, measure: bool, hw_run: bool) -> None:
        """Add the error table fp8_error (this variant, per (bh, q_block), against float64 on the
        inputs' device) and meta['fp8'] (scaling, hadamard, variant, quantise_ms, overall errors)."""
        q, k, v = self.inputs
        ref = reference_fp64(q, k, v, self.spec.text, self.sm_scale)
        variant = fp8_variant(self.scaling, self.hadamard)
        table = error_table(out, ref, self.cfg.block_m, variant)
        diff = out.double() - ref
        quant_ms = None
        if measure and hw_run:
            quant_ms = time_ms(lambda: quantize_fp8(q, k, v, self.scaling, self.hadamard, self.cfg.block_m,
                                                    self.cfg.block_n, gluon=self.x.gluon,
                                                    key_order=self.x.key_order), q.device,
                               warmup=10, rep=60)
        trace.tables["fp8_error"] = table
        if self.schedule == "persistent":
            from kernels.gluon_fp8_launch import PERSISTENT_HEADS

            trace.meta["kernel"]["work_order"] = (f"each program's list: the items dealt longest first to the least "
                                                  f"loaded program, {PERSISTENT_HEADS} heads at a time")
        trace.meta["precision"] = "fp8"
        trace.meta["fp8"] = {
            "scaling": self.scaling, "hadamard": self.hadamard, "variant": variant, "format": "float8 e4m3fn",
            "rmse": float(diff.pow(2).mean().sqrt()), "max_abs": float(diff.abs().max()),
            "reference": f"float64 on {q.device}", "quantise_ms": quant_ms,
            "timed": "untraced_ms / traced_ms: the attention kernel on inputs quantised once; quantise_ms: "
                     "the quantise-and-rotate pass alone",
        }


def fp8_recording(q, k, v, mask, block_m, block_n, sm_scale, schedule, num_warps, num_stages, backward,
                  scaling, hadamard) -> Fp8Recording:
    """Check an FP8 record call and quantise its inputs once.

    Arguments:
        as instrumentation.record's (scaling, hadamard: kernels.flash_attention_fp8's).
    Returns:
        Fp8Recording. Raises ValueError (one line) for what the FP8 kernel does not do: a backward,
        a schedule other than natural (the default: the kernel runs its own, Fp8Recording.schedule),
        explicit num_warps / num_stages, bad scaling / hadamard / dtype / block sizes, inputs that
        require grad."""
    if backward:
        raise ValueError("precision='fp8' records the forward only: leave backward=False")
    if schedule != "natural":
        raise ValueError(f"precision='fp8' runs the FP8 kernel's own schedule (persistent on Hopper, else "
                         f"natural): leave schedule out, got schedule={schedule!r}")
    if num_warps is not None or num_stages is not None:
        raise ValueError("precision='fp8' picks its own num_warps and num_stages: leave them out")
    check_fp8_args(q, k, v, scaling, hadamard)
    b, h, n_q, d = q.shape
    n_k = k.shape[2]
    spec = parse_mask(mask, n_q, n_k)
    c = fp8_config(d, block_m, block_n, mask=spec, n_q=n_q, n_k=n_k, device=q.device)
    call_size(spec, b * h, n_q, n_k, c.block_m, c.block_n, interpreter=interpreting())
    x = quantize_fp8(q, k, v, scaling, hadamard, c.block_m, c.block_n, mask=spec, gluon=c.gluon)
    return Fp8Recording(spec, KernelConfig(c.block_m, c.block_n, c.num_warps, c.num_stages), (q, k, v), x,
                        sm_scale, scaling, hadamard)
