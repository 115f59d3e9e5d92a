"""The implementations benchmarks.attention times, one place for all of them: their names
(IMPLS), which masks and devices each runs (applicable), the call that computes each one's output
(make_call), our kernels' tile config per case (kernel_config) and naive attention's memory
gate (naive_fits).

Adding an implementation: its name in IMPLS (the table's column order), a branch in applicable()
if it cannot run every mask or device, and a branch in make_call() returning its call; for a
kernel of ours with a tile config also an entry in SCHEDULE_OF (benchmarks.attention looks its
config up for those). The CLI, the table and the result file take the new name from IMPLS.
"""

from __future__ import annotations

import contextlib

from . import DTYPES, mask_kind, split_list, tile_fraction

import torch  # noqa: E402

from kernels import default_config, flash_attention, naive_attention  # noqa: E402
from kernels.gluon_launch import ROWS_PER_ITEM, gluon_tiles  # noqa: E402

IMPLS = ("sdpa_cudnn", "tilescope", "tilescope:longest_first", "tilescope:persistent",
         "sdpa_flash", "sdpa_efficient", "flex", "naive",
         "tilescope_fp8", "tilescope_fp8_total", "tilescope_fp8_total:block", "tilescope_fp8_total:tensor")
# kernels.flash_attention_fp8 (bf16 inputs, e4m3 products): tilescope_fp8 times the attention kernel
# alone on inputs quantised once (block scales + Hadamard; every scaling runs the same kernel),
# tilescope_fp8_total the whole call (quantise-and-rotate pass + attention) per scaling. Asked for
# by name or 'all'; the default run leaves them out (DEFAULT_IMPLS).
FP8_IMPLS = {"tilescope_fp8": ("block", True), "tilescope_fp8_total": ("block", True),
             "tilescope_fp8_total:block": ("block", False), "tilescope_fp8_total:tensor": ("tensor", False)}
DEFAULT_IMPLS = tuple(i for i in IMPLS if i not in FP8_IMPLS)
# e4m3 keeps 3 mantissa bits: the FP8 outputs' relative error is ~0.05 on standard-normal inputs
# (measured in the interpreter, N 64-128, every scaling), so they are checked against 0.1
FP8_TOLERANCE = 0.1
SCHEDULE_OF = {"tilescope": "natural", "tilescope:natural": "natural",
               "tilescope:longest_first": "longest_first", "tilescope:persistent": "persistent"}
SDPA_BACKENDS = {"sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_flash": "FLASH_ATTENTION",
                 "sdpa_efficient": "EFFICIENT_ATTENTION"}
SDPA_MASKS = ("full", "causal")      # what SDPA expresses without an explicit mask tensor
NAIVE_MASKS = ("full", "causal")


def tolerance(impl: str, dtype_name: str, default: float) -> float:
    """The relative error an impl's output may have: FP8_TOLERANCE for the FP8 impls, else the
    dtype's (benchmarks.TOLERANCE, passed as default)."""
    return FP8_TOLERANCE if impl in FP8_IMPLS else default


def parse_impls(text: str) -> list[str]:
    """The --impls list in IMPLS order.

    Arguments: text, a comma list of names from IMPLS ('all' or '*' for every one;
    'tilescope:natural' is 'tilescope').
    Returns: the names, sdpa_cudnn first where asked for. Raises SystemExit (one 'error:' line)
    for an unknown name.
    """
    out = []
    for name in split_list(text):
        name = name.strip().lower()
        if name in ("all", "*"):
            out.extend(IMPLS)
            continue
        if name == "tilescope:natural":
            name = "tilescope"
        if name not in IMPLS:
            raise SystemExit(f"error: unknown impl {name!r}; use some of {', '.join(IMPLS)}")
        out.append(name)
    # sdpa_cudnn first: its output is the one every other impl is compared with
    return [i for i in IMPLS if i in out]


def applicable(impl: str, spec, device=None) -> bool:
    """Whether impl can run spec's mask on device (None: any device).

    Arguments: impl, a name from IMPLS; spec, a MaskSpec; device, a torch device or None.
    Returns: False where the implementation cannot express the mask (SDPA and naive: full and
    causal only) or the device (flex: CUDA only).
    """
    if impl == "flex":
        return device is None or torch.device(device).type == "cuda"
    if impl.startswith("sdpa_"):
        return spec.kind in SDPA_MASKS
    if impl == "naive":
        return spec.kind in NAIVE_MASKS
    return True


def naive_bytes(batch, heads, n, elem_bytes) -> int:
    """Peak bytes naive attention needs beyond q, k, v: S and P (B, H, N, N) plus the mask."""
    return 2 * batch * heads * n * n * elem_bytes + 2 * n * n


def naive_fits(device, batch, heads, n, elem_bytes) -> bool:
    """Whether naive attention's S and P fit: under 85% of free CUDA memory, or 2**26 scores on
    the CPU. Arguments: device and the (batch, heads, n) shape, elem_bytes per element.
    Returns: True when naive is timed, False when it is recorded as 'too_big'."""
    need = naive_bytes(batch, heads, n, elem_bytes)
    if torch.device(device).type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return need < 0.85 * free
    return batch * heads * n * n <= 2 ** 26


def kernel_config(impl: str, rec: dict, tuned, spec, device) -> dict | None:
    """Our kernel's tile config for one case, written into its record.

    Arguments: impl, a name from IMPLS; rec, the case's record (head_dim, seq_len, dtype read;
    config, config_source, schedule and tiles_frac set for our kernels); tuned, the TunedConfigs
    of --config-file or None; spec, the MaskSpec; device, the torch device.
    Returns: the config dict make_call passes on (the tuned one where the file has the case, else
    kernels.default_config's), or None for an implementation that is not ours.
    """
    d, n, dtype_name = rec["head_dim"], rec["seq_len"], rec["dtype"]
    if impl in FP8_IMPLS:
        from kernels.fp8 import default_launch

        c = default_launch(d, spec, n, n, device)       # what runs: tiles, options, plain / ws / split
        rec.update(config_source="default", schedule="natural", scaling=FP8_IMPLS[impl][0],
                   hadamard=FP8_IMPLS[impl][1], tiles_frac=tile_fraction(spec, n, c["block_m"], c["block_n"]),
                   config=c)
        return None
    if impl not in SCHEDULE_OF:
        return None
    cfg = tuned.lookup(d, spec, n, dtype_name) if tuned else None
    rec["config_source"] = "tuned" if cfg else "default"
    gluon = None if cfg else gluon_tiles(d, DTYPES[dtype_name], device, SCHEDULE_OF[impl], n)
    if gluon:           # the default call runs the Gluon kernel (kernels.gluon_launch): no tiles passed
        block_n, stages = gluon
        rec.update(config=dict(kernel="gluon", block_m=ROWS_PER_ITEM, block_n=block_n, num_warps=4,
                               num_stages=stages),
                   schedule=SCHEDULE_OF[impl], tiles_frac=tile_fraction(spec, n, ROWS_PER_ITEM, block_n))
        return {}
    cfg = cfg or default_config(d, DTYPES[dtype_name], n=n, mask=spec, device=device,
                                schedule=SCHEDULE_OF[impl]).as_dict()
    rec["config"] = cfg
    rec["schedule"] = SCHEDULE_OF[impl]
    rec["tiles_frac"] = tile_fraction(spec, n, cfg["block_m"], cfg["block_n"])
    return cfg


def make_call(impl, q, k, v, spec, cfg):
    """One implementation's call on fixed inputs.

    Arguments: impl, a name from IMPLS; q, k, v (B, H, N, D); spec, a MaskSpec; cfg, our kernel's
    config dict (block_m, block_n, num_warps, num_stages) or None for the others.
    Returns: (fn, context): fn() computes the output; context() wraps both the check and the timing.
    """
    if impl in FP8_IMPLS:
        from kernels.fp8 import attention_fp8, flash_attention_fp8
        from kernels.fp8_quant import quantize_fp8

        scaling, hadamard = FP8_IMPLS[impl]
        if impl == "tilescope_fp8":         # the attention kernel alone: quantised once, here
            x = quantize_fp8(q, k, v, scaling, hadamard, mask=spec)
            return (lambda: attention_fp8(x, spec)), contextlib.nullcontext
        return (lambda: flash_attention_fp8(q, k, v, spec, scaling=scaling, hadamard=hadamard)), contextlib.nullcontext
    if impl in SCHEDULE_OF:
        sched = SCHEDULE_OF[impl]
        return (lambda: flash_attention(q, k, v, mask=spec, schedule=sched, **cfg)), contextlib.nullcontext
    if impl in SDPA_BACKENDS:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, SDPA_BACKENDS[impl])
        causal = spec.kind == "causal"
        fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
        return fn, (lambda: sdpa_kernel(backend))
    if impl == "naive":
        return (lambda: naive_attention(q, k, v, mask=spec)), contextlib.nullcontext
    if impl == "flex":
        return flex_call(q, k, v, spec), contextlib.nullcontext
    raise ValueError(f"unknown impl {impl!r}")


_FLEX = []   # one compiled flex_attention for the whole run


def flex_call(q, k, v, spec):
    """Compiled FlexAttention with the mask as a BlockMask (built here, once per mask and N): the
    mask's own predicate where it is pure index arithmetic, else its per-row intervals."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if not _FLEX:
        # each mask and N is a new guard set: past dynamo's recompile limit (8) flex_attention
        # silently runs eagerly (materialising N x N scores), which is not the peer we time
        import torch._dynamo as dynamo    # (a plain `import torch._dynamo` would make torch local)

        dynamo.config.recompile_limit = max(dynamo.config.recompile_limit, 256)
        # static shapes: from the second N on, automatic dynamic shapes gave a slower generic kernel
        _FLEX.append(torch.compile(flex_attention, dynamic=False))
    n_q, n_k = q.shape[2], k.shape[2]
    block_mask = None
    if mask_kind(spec) != "full":
        pred = spec.predicate(n_q, n_k)
        try:
            idx = torch.arange(2, device=q.device)
            pred(idx[:, None], idx[None, :])
        except (RuntimeError, TypeError, IndexError):   # a predicate holding host tables
            lo, hi = (torch.from_numpy(a).to(q.device) for a in spec.row_intervals(n_q, n_k))
            pred = lambda qi, ki: (ki >= lo[qi]) & (ki <= hi[qi])  # noqa: E731
        block_mask = create_block_mask(lambda b, h, qi, ki: pred(qi, ki), None, None, n_q, n_k,
                                       device=q.device)
    return lambda: _FLEX[0](q, k, v, block_mask=block_mask)
