"""The default launches of the attention kernels built for Hopper (sm_90) on a machine without a GPU:
registers, spill stack, shared memory and whether the loop was warp-specialised, per launch.

    pip install --target /tmp/t36 --no-deps triton==3.6.0       # the GPU machines' Triton
    PYTHONPATH=/tmp/t36:. python scripts/sm90_build_stats.py [--only fwd,bwd,fp8,gluonbwd,gluonfwd] [--cases D:N:mask,...]
        [--config TILES_AND_OPTIONS] [--tokens] [--work-traced] [--json OUT] [--sass DIR]

Each call of the public API runs as on an H200 (its device facts: 132 SMs, warp specialisation on),
but every kernel launch is only compiled (Triton's warmup: TTIR -> PTX -> ptxas -> cubin), never run,
and cuobjdump reads the cubin's resource use and its SASS (the longest tile loop's instruction mix). STACK > 0 means ptxas spilled registers (or kept a
local array) there: a first place to look when a kernel is slower than its arithmetic says. The
numbers are those of the Triton on the path: build with the GPU machines' version (3.6) to compare
with their timings. A warp-specialised kernel reports the launch's register count; its partitions
then set their own (setmaxnreg). gluonbwd (not in the default parts): the Gluon backward probes
(benchmarks.gluon_backward's dK/dV pass, its statistics loaded by each thread and by TMA, its dQ pass, benchmarks.gluon_backward_fused with dQ added by
the consumers and by a writer warp, its ablation that stores dQ, with the statistics by TMA, with those and dQ by
TMA bulk reduce-adds, and each tile's dQ a tile late), 2 stages; at D 256 the product's D 256 kernel alone
(benchmarks.gluon_backward_d256). gluonfwd (nor this): the persistent Gluon forward (kernels.gluon_fwd_persistent_kernel, schedule="persistent")."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sass_loops import spills_in_loops, tile_loop_mix  # noqa: E402

FWD = [(64, 4096, "full"), (64, 8192, "causal"), (128, 4096, "full"), (128, 4096, "causal"), (128, 8192, "causal"),
       (256, 4096, "full"), (256, 4096, "causal")]
BWD = [(64, 4096, "full"), (64, 4096, "causal"), (128, 4096, "full"), (128, 4096, "causal"), (256, 4096, "causal")]
# the product's Gluon backward (bwdgluon) and the probes (gluonbwd) at the same cases
BWDGLUON = [(64, 4096, "causal"), (128, 4096, "full"), (128, 4096, "causal"), (256, 4096, "causal")]
GLUONFWD = [(64, 4096, "full"), (128, 4096, "full"), (128, 4096, "causal")]
FP8 = [(128, 4096, "full"), (128, 4096, "causal"), (128, 8192, "causal"), (256, 4096, "full"), (256, 4096, "causal")]


class _Sm90Driver:
    """Triton's active driver, answering for a Hopper GPU that is not there (nothing is launched)."""

    def __init__(self):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_device_interface(self):
        import torch

        return torch.cuda

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    def get_benchmarker(self):
        return None

    def map_python_to_cpp_type(self, ty):
        return ty


def _cuobjdump(compiled, flag: str) -> str:
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([str(tool), flag, f.name], capture_output=True, text=True, check=True).stdout


def resources(compiled) -> dict:
    """Registers, stack bytes (spills), shared memory and warps of a compiled kernel (cuobjdump),
    whether its loop was warp-specialised, its SASS, the spill instructions in its tile loops
    (sass_loops.spills_in_loops) and the longest one's instruction mix (tile_loop_mix)."""
    out = _cuobjdump(compiled, "-res-usage")
    regs, stack = re.search(r"REG:(\d+)", out), re.search(r"STACK:(\d+)", out)
    sass = _cuobjdump(compiled, "-sass")
    return dict(registers=int(regs.group(1)) if regs else None, stack_bytes=int(stack.group(1)) if stack else None,
                shared_kib=round(compiled.metadata.shared / 1024, 1), warps=compiled.metadata.num_warps,
                warp_specialized="ttg.warp_specialize" in compiled.asm["ttgir"],
                spills_in_loops=spills_in_loops(sass), tile_loop=tile_loop_mix(sass), sass=sass)


def _loops(kernel, args, options=None) -> str:
    """Which tile loops a launch compiles, from its constexpr groups: full / partial tiles (forward,
    FP8), the finite-row twin (backward), who adds dQ (the fused Gluon backward probe)."""
    named = {**dict(zip(kernel.arg_names, args)), **(options or {})}
    phase = named.get("PHASE") or named.get("TILE")
    if hasattr(phase, "OFF_BAND"):
        return " + ".join(name for name, on in (("full", phase.OFF_BAND), ("partial", phase.HAS_PARTIAL)) if on) + \
            (" (resumed)" if phase.SEED else "")
    if named.get("TRACE_WORK"):
        return "work traced" + (", (B, N, H, D) inputs" if named.get("TOKEN_MAJOR") else "")
    if named.get("TOKEN_MAJOR"):
        return "(B, N, H, D) inputs"
    stats = ", stats by TMA" if named.get("STATS_TMA") else ""
    if "DQ_WRITER" in named:
        return ("dQ by a writer warp" if named["DQ_WRITER"] else "dQ stored (ablation)" if named.get("DQ_STORE") else
                "dQ by TMA reduce-adds" if named.get("DQ_TMA") else "dQ by the consumers") + stats + \
            (", dQ a tile late" if named.get("DQ_LATE") else "")
    if stats:
        return stats[2:]
    if "FINITE_RUN" in named:
        return "finite-row twin" if named["FINITE_RUN"] else "dK/dV + dQ" if named["DKDV"] and named["DQ_PASS"] else \
            "dK/dV" if named["DKDV"] else "dQ"
    return ""


def _as_h200(rows: list, work_traced: bool = False) -> None:
    """Device facts of an H200 for CPU tensors, and every launch path compiling instead of running,
    each built launch appended to rows; work_traced: each Gluon forward launch also built with its
    work-level trace on (what record()'s work-only launch runs)."""
    import kernels.backward_launch as backward_launch
    import kernels.backward_plan as backward_plan
    from kernels.backward_direct import launch_options
    import kernels.fp8 as fp8
    import kernels.launch as launch
    import kernels.runtime as runtime

    runtime._look_up = lambda device: runtime.DeviceFacts("cuda", (9, 0), 132, "h200", True, False)
    runtime.clear_device_facts()
    backward_plan.interpreting = lambda: False
    cuda_config = backward_plan.CUDA_CONFIGS

    def backward_config(head_dim, dtype, device, deterministic=False):
        d = backward_plan.padded_head_dim(head_dim)
        return cuda_config[64 if d <= 64 else 128 if d <= 128 else 256]

    for mod in [m for name, m in list(sys.modules.items()) if name.startswith("kernels") and m is not None]:
        if hasattr(mod, "check_kernel_device"):
            mod.check_kernel_device = lambda device: None
        if hasattr(mod, "backward_config"):
            mod.backward_config = backward_config

    def build(kernel, grid, args, options):
        rows[-1]["launches"].append(dict(kernel=kernel.__name__, loops=_loops(kernel, args, options),
                                         num_warps=options.get("num_warps"), num_stages=options.get("num_stages"),
                                         **resources(kernel.warmup(*args, grid=grid, **options))))

    launch._run_kernel = build
    backward_launch._launch = lambda kernel, grid, args, cfg=None: build(
        kernel, grid, [args[n] for n in kernel.arg_names],
        launch_options(cfg))

    def fp8_launch(grid, one, args):
        build(one.args.kernel, grid, args, one.options)
    fp8._launch = fp8_launch

    import kernels.gluon_fwd_kernel as gluon_fwd

    class GluonBuild:           # the Gluon forward's launches (kernels.gluon_launch), compiled
        arg_names = gluon_fwd.attn_fwd_gluon_kernel.arg_names       # the plan builds its arguments by name

        def __getitem__(self, grid):
            return lambda *args, **options: self.build(grid, list(args), options)

        def build(self, grid, args, options):
            build(kernel, grid, args, options)
            if work_traced:
                import torch

                at = kernel.arg_names.index
                args[at("tr_work")], args[at("TRACE_WORK")] = torch.zeros(5, dtype=torch.int64), True
                build(kernel, grid, args, options)
    kernel = gluon_fwd.attn_fwd_gluon_kernel
    gluon_fwd.attn_fwd_gluon_kernel = GluonBuild()

    import kernels.gluon_bwd_kernel as gluon_bwd_kernel
    import benchmarks.backward_atomic as backward_atomic
    import benchmarks.gluon_backward as gluon_bwd
    import benchmarks.gluon_backward_fused as gluon_fused
    from kernels import gluon_bwd_d256_kernel as gluon_d256, gluon_bwd_onepass_kernel as gluon_onepass
    import kernels.gluon_fp8_persistent_kernel as gluon_fp8_persistent
    import kernels.gluon_fwd_persistent_kernel as gluon_fwd_persistent
    import kernels.gluon_fp8_kernel as gluon_fp8

    class Built:                # the Gluon backward kernels' launches, compiled
        def __init__(self, jit):
            self.jit = jit
            self.arg_names = jit.arg_names          # kernels.gluon_bwd_launch builds its arguments by name

        def __getitem__(self, grid):
            return lambda *args, **options: build(self.jit, grid, args, options)
    for mod, name in ((gluon_bwd_kernel, "attn_bwd_dkdv_gluon_kernel"), (gluon_bwd_kernel, "attn_bwd_dq_gluon_kernel"),
                      (gluon_bwd, "attn_bwd_dkdv_gluon_kernel"), (gluon_fused, "attn_bwd_fused_gluon_kernel"),
                      (gluon_onepass, "attn_bwd_onepass_gluon_kernel"), (gluon_d256, "attn_bwd_d256_gluon_kernel"),
                      (gluon_fp8, "attn_fwd_fp8_gluon_kernel"),
                      (gluon_fp8_persistent, "attn_fwd_fp8_gluon_persistent_kernel"),
                      (gluon_fwd_persistent, "attn_fwd_gluon_persistent_kernel")):
        setattr(mod, name, Built(getattr(mod, name)))
    backward_atomic._stats_kernel = collections.defaultdict(lambda: lambda *args, **options: None)  # not surveyed


CONFIG_FIELDS = dict(fwd=("block_m", "block_n", "num_warps", "num_stages"),
                     fp8=("block_m", "block_n", "num_warps", "num_stages"),
                     bwd=("block_m1", "block_n1", "block_m2", "block_n2", "num_warps", "num_stages"))


def _build_case(part: str, d: int, n: int, mask: str, config: tuple | None = None) -> None:
    """Every launch of one call (B1 H2, N_q = N_k = n, bf16 inputs), built through _as_h200's hooks;
    config: the part's CONFIG_FIELDS values instead of the defaults (the call's own checks apply)."""
    from kernels import flash_attention
    from kernels.backward import flash_attention_backward
    from kernels.fp8 import attention_fp8
    from kernels.fp8_quant import GLUON_FP8, Fp8Inputs, fp8_config, fp8_head_dim
    from kernels.masks import parse_mask

    import torch

    bf16 = torch.bfloat16
    q, k, v, o, do = (torch.zeros(1, 2, n, d, dtype=bf16) for _ in range(5))
    given = dict(zip(CONFIG_FIELDS[part], config)) if config else {}
    if part == "fwd":
        if os.environ.get("TILESCOPE_GLUON_TOKENS") == "1":     # --tokens: transformers' (B, N, H, D) memory
            q, k, v = (torch.zeros(1, n, 2, d, dtype=bf16).transpose(1, 2) for _ in range(3))
        flash_attention(q, k, v, mask=mask, **given)
    elif part == "bwd":
        from kernels.backward_plan import BackwardConfig

        cfg = BackwardConfig(**given) if given else None
        flash_attention_backward(do, q, k, v, o, torch.zeros(1, 2, n, dtype=torch.float32), mask=mask, config=cfg)
    elif part == "bwdgluon":    # the product's Gluon passes (and the Triton finite-row twin), untraced and traced
        from kernels.backward import GLUON_CONFIGS, backward_trace_buffers

        lse = torch.zeros(1, 2, n)
        if d not in GLUON_CONFIGS:
            raise ValueError(f"bwdgluon builds the product's Gluon backward, D {' or '.join(map(str, GLUON_CONFIGS))}")
        cfg = GLUON_CONFIGS[d]
        for deterministic in (False, True) if d == 128 else (False,):   # the one pass, then the two passes
            det = dataclasses.replace(cfg, deterministic=deterministic)
            flash_attention_backward(do, q, k, v, o, lse, mask=mask, config=det)
            trace = backward_trace_buffers(q, k, mask, (1,), config=det)
            flash_attention_backward(do, q, k, v, o, lse, mask=mask, config=det, trace=trace)
    elif part == "gluonbwd":
        from benchmarks.gluon_backward import gluon_dkdv
        from benchmarks.gluon_backward_dq import gluon_dq
        from benchmarks.gluon_backward_fused import gluon_backward_fused
        from benchmarks.gluon_backward_onepass import gluon_backward_onepass
        from benchmarks.gluon_backward_d256 import gluon_backward_d256

        lse = torch.zeros(1, 2, n)
        if d == 256:    # the D 256 one pass alone (the other probes take D 64 and 128)
            gluon_backward_d256(do, q, k, v, o, lse, mask)
            return
        for stats_tma in (False, True):
            gluon_dkdv(do, q, k, v, o, lse, mask, stages=2, stats_tma=stats_tma)
        for block_n in (64, 128):
            gluon_dq(do, q, k, v, o, lse, mask, block_n=block_n, stages=2)
        for writer, store, stats_tma, dq_tma, late in (
                (False, False, False, False, False), (True, False, False, False, False),
                (False, True, False, False, False), (False, False, True, False, False), (False, False, True, True, False),
                (False, False, True, False, True), (False, False, True, True, True), (True, False, True, False, True)):
            gluon_backward_fused(do, q, k, v, o, lse, mask, dq_writer=writer, dq_store=store, stats_tma=stats_tma,
                                 dq_tma=dq_tma, dq_late=late)
        for stages in (2, 3):
            gluon_backward_onepass(do, q, k, v, o, lse, mask, stages=stages)
        for by_rows in (False, True) if d == 64 else ():    # FlashAttention-3's D 64 tile: 128 query rows
            gluon_backward_onepass(do, q, k, v, o, lse, mask, rows=128, dq_by_rows=by_rows)
    elif part == "gluonfwd":        # the persistent Gluon forward (kernels.gluon_fwd_persistent_kernel)
        flash_attention(q, k, v, mask=mask, schedule="persistent")
    else:           # the attention kernel's launches on inputs of the quantised layout (no quantise pass)
        cfg = fp8_config(d, given.get("block_m"), given.get("block_n"), mask=parse_mask(mask, n, n), n_q=n, n_k=n,
                         device="cuda")
        hd, e4m3 = fp8_head_dim(d), torch.float8_e4m3fn
        ones = lambda blocks: torch.ones(2 * -(-n // blocks))  # noqa: E731
        x = Fp8Inputs(torch.zeros(2, n, hd, dtype=e4m3), torch.zeros(2, n, hd, dtype=e4m3), torch.zeros(2, hd, n, dtype=e4m3),
                      ones(cfg.block_m), ones(cfg.block_n), ones(cfg.block_n), (1, 2, n, d), n, 2, cfg.block_m, cfg.block_n,
                      "block", True, bf16, cfg.gluon, cfg.gluon and GLUON_FP8[hd].relabel)
        attention_fp8(x, mask, num_warps=given.get("num_warps"), num_stages=given.get("num_stages"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="fwd,bwd,fp8", help="comma-separated parts: fwd, bwd, fp8, gluonbwd, gluonfwd, bwdgluon (default "
                   "fwd,bwd,fp8)")
    p.add_argument("--cases", default=None,
                   help="comma-separated D:N:mask, e.g. 128:4096:causal, for every part asked (default: each part's list)")
    p.add_argument("--config", default=None,
                   help="with one part in --only, its tiles and launch options instead of the defaults: fwd and fp8 "
                        "block_m,block_n,num_warps,num_stages; bwd block_m1,block_n1,block_m2,block_n2,num_warps,num_stages")
    p.add_argument("--tokens", action="store_true", help="fwd: q, k, v in transformers' (B, N, H, D) memory "
                   "(the Gluon forward's TILESCOPE_GLUON_TOKENS path)")
    p.add_argument("--work-traced", action="store_true", help="fwd: each Gluon forward launch also with its "
                   "work-level trace on (record()'s work-only launch)")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    p.add_argument("--sass", default=None, help="also write each launch's SASS (cuobjdump -sass) into this folder")
    args = p.parse_args(argv)
    if os.environ.setdefault("TRITON_INTERPRET", "0") not in ("", "0"):      # before kernels is imported
        sys.exit("sm90_build_stats: unset TRITON_INTERPRET (the kernels are built for sm_90 here, not interpreted)")
    if args.tokens:
        os.environ["TILESCOPE_GLUON_TOKENS"] = "1"
    parts = set(args.only.split(","))
    if parts - {"fwd", "bwd", "fp8", "gluonbwd", "gluonfwd", "bwdgluon"}:
        p.error(f"--only takes fwd, bwd, fp8, gluonbwd, gluonfwd, bwdgluon; got {args.only}")
    chosen = None
    if args.cases:
        try:
            chosen = [(int(d), int(n), mask) for d, n, mask in (c.split(":") for c in args.cases.split(","))]
        except ValueError:
            p.error(f"--cases takes D:N:mask entries such as 128:4096:causal; got {args.cases}")
    config = None
    if args.config:
        if len(parts) != 1:
            p.error("--config applies to one part: name it alone in --only (fwd, bwd or fp8)")
        fields = CONFIG_FIELDS[next(iter(parts))]
        try:
            config = tuple(int(x) for x in args.config.split(","))
        except ValueError:
            config = ()
        if len(config) != len(fields):
            p.error(f"--config for {next(iter(parts))} takes {len(fields)} integers, {','.join(fields)}; got {args.config}")
    import triton
    from triton.runtime import driver as triton_driver

    triton_driver.set_active(_Sm90Driver())
    importlib.import_module("kernels.backward")     # before _as_h200 patches the modules it finds

    rows: list = []
    _as_h200(rows, args.work_traced)
    lists = dict(fwd=FWD, bwd=BWD, fp8=FP8, gluonbwd=BWDGLUON, gluonfwd=GLUONFWD, bwdgluon=BWDGLUON)
    cases = [(part, *c) for part in ("fwd", "bwd", "fp8", "gluonbwd", "gluonfwd", "bwdgluon") if part in parts for c in (chosen or lists[part])]
    for part, d, n, mask in cases:
        rows.append(dict(part=part, head_dim=d, seq_len=n, mask=mask, config=config, launches=[]))
        try:
            _build_case(part, d, n, mask, config)
        except ValueError as exc:           # a case the kernels refuse (a mask, a head dim, tiles): one line
            print(f"sm90_build_stats: {part} D{d} N{n} {mask}: {exc}", file=sys.stderr)
            return 2
        for i, one in enumerate(rows[-1]["launches"]):
            opts = f"w{one['num_warps']} s{one['num_stages']}" if one["num_warps"] else "defaults"
            print(f"{part:3s} D{d:<3d} N{n:<5d} {mask:6s} {one['kernel']:20s} {one['loops']:18s} {opts:8s} "
                  f"{'ws ' if one['warp_specialized'] else '   '}regs {one['registers']:3d}  stack {one['stack_bytes']:4d} B "
                  f"(in tile loops: {one['spills_in_loops']:3d} LDL/STL)  shared {one['shared_kib']:6.1f} KiB  "
                  f"tile loop {one['tile_loop']['instructions']:4d} instructions", flush=True)
            if args.sass:
                Path(args.sass).mkdir(parents=True, exist_ok=True)
                name = f"{part}-d{d}-n{n}-{mask.replace(':', '_')}-{i}-{one['kernel']}.sass"
                (Path(args.sass) / name).write_text(one["sass"])
        for one in rows[-1]["launches"]:
            del one["sass"]
    if args.json:
        meta = dict(triton=triton.__version__, target="cuda sm_90 (built, not run)",
                    command="PYTHONPATH=/tmp/t36:. python scripts/sm90_build_stats.py " + " ".join(argv or sys.argv[1:]))
        Path(args.json).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
