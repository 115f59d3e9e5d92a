"""How many of the FP8 softmax's instructions an SM issues a clock: ex2.approx (MUFU.EX2), the
e4m3 pair conversion (F2FP...E4M3.F32.PACK_AB), both mixed as the FP8 kernel has them (two
exponentials a conversion), and FFMA, each on its own. Whether the conversion shares the MUFU's
pipe decides what can take exponentials off it (docs/performance.md, the FP8 section).

    python scripts/sm_pipes_probe.py OUT.json

One program per SM of 4, 8 or 16 warps, one element a thread, each looping 512 times over an inline
PTX block of 8 independent operations on 8 loop-carried registers; its clock64 span read around
the loop. Per mix and warps: cycles (the median over SMs) and lanes a clock per SM (8 operations x
512 x warps x 32 lanes / cycles; the conversion block counts its conversions and also holds 8 moves
that pack its halves, the mixed block 7 + 1 exponentials, 4 conversions and 2 adds). Writes OUT.json
(device, versions, commit, one record per mix and warps)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
ITERS = 512
OPS = 8                 # the main operations of a block, per iteration
_CVT = "cvt.rn.satfinite.e4m3x2.f32"
MIXES = {   # name: PTX of 8 outputs ($0-$7) from 8 inputs ($8-$15)
    "ex2": "".join(f"ex2.approx.ftz.f32 ${i}, ${i + 8};" for i in range(8)),
    "cvt_e4m3x2": ("{.reg .b16 h<8>;" + "".join(f"{_CVT} h{i}, ${8 + i}, ${8 + (i + 1) % 8};" for i in range(8))
                   + "".join(f"mov.b32 ${i}, {{h{2 * i}, h{2 * i + 1}}};" for i in range(4))
                   + "".join(f"mov.b32 ${4 + i}, {{h{2 * i + 1}, h{2 * i}}};" for i in range(4)) + "}"),
    "ex2_2_per_cvt": ("{.reg .b16 h<4>;" + "".join(f"ex2.approx.ftz.f32 ${i}, ${i + 8};" for i in range(7))
                      + "".join(f"{_CVT} h{i}, ${8 + 2 * i}, ${9 + 2 * i};" for i in range(4))
                      + "mov.b32 $7, {h0, h1}; ex2.approx.ftz.f32 $7, $7; add.f32 $7, $7, $15;"
                      + "mov.b32 $6, {h2, h3}; add.f32 $6, $6, $14;}"),
    "ffma": "".join(f"fma.rn.f32 ${i}, ${8 + i}, ${8 + (i + 1) % 8}, ${8 + (i + 2) % 8};" for i in range(8)),
}


def lanes_per_clock(cycles: float, warps: int, iters: int = ITERS) -> float:
    """Lanes of the block's main operations an SM completes a clock: OPS x iters x warps x 32 / cycles."""
    return OPS * iters * warps * 32 / cycles


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def probe(out, ITERS: tl.constexpr, ASM: tl.constexpr, BLOCK: tl.constexpr):
        a = tl.arange(0, BLOCK).to(tl.float32) * 0.001
        b, c, d, e, f, g, h = a + 0.1, a + 0.2, a + 0.3, a + 0.4, a + 0.5, a + 0.6, a + 0.7
        t0 = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
        for _ in range(ITERS):
            a, b, c, d, e, f, g, h = tl.inline_asm_elementwise(
                ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r,r,r,r", [a, b, c, d, e, f, g, h], dtype=(tl.float32,) * 8,
                is_pure=False, pack=1)
        t1 = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
        pid = tl.program_id(0)
        tl.store(out + pid * 2, t1 - t0)
        tl.store(out + pid * 2 + 1, tl.sum(a + b + c + d + e + f + g + h, 0).to(tl.int64))    # (kept live)
    return probe


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("sm_pipes_probe: no CUDA GPU here (it times instructions on one)", file=sys.stderr)
        return 2
    from benchmarks import write_gpu_records

    probe = _kernel()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    records = []
    for warps in (4, 8, 16):
        for name, asm in MIXES.items():
            out = torch.zeros(sms * 2, dtype=torch.int64, device="cuda")
            for _ in range(2):          # the first launch compiles
                probe[(sms,)](out, ITERS, asm, 32 * warps, num_warps=warps)
            torch.cuda.synchronize()
            cycles = float(out.view(-1, 2)[:, 0].double().median())
            rec = dict(mix=name, warps=warps, cycles=cycles, lanes_per_clock_per_sm=lanes_per_clock(cycles, warps))
            records.append(rec)
            print(f"{name:14s} {warps:2d} warps: {cycles:9.0f} cycles, {rec['lanes_per_clock_per_sm']:6.2f} lanes a "
                  f"clock per SM", flush=True)
    write_gpu_records(args.out, records, "python scripts/sm_pipes_probe.py OUT.json", iters=ITERS, ops_per_iter=OPS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
