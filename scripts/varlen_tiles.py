"""Varlen tile shapes side by side, in one process on one GPU.

    python scripts/varlen_tiles.py --batches 16x1024,ragged9 --variants 64/64/4/3,128/64/8/3
    python scripts/varlen_tiles.py --cpu-smoke --out /tmp/v     # the interpreter, tiny shapes, no Flex

Per packed batch (causal, H 32 / H_kv 8, D 128, bf16, as benchmarks.serving's varlen part):
flash_attention_varlen at each --variants tile `block_m/block_n/num_warps/num_stages` and as the
default call (no tile arguments; its record names the tiles kernels.varlen._launch resolves it
to), our dense flash_attention on the batch padded to (B, H, max_len, D), and compiled
FlexAttention with the causal document mask on the packed batch. Every output is checked against
float64 attention per sequence first (a wrong one is recorded, never timed); then do_bench medians
(L2 flushed between calls), --rounds rounds with the implementations interleaved, median over the
rounds. tflops count 4 H D per visible (query, key) pair; speed_vs_flex = Flex ms / this ms.
Writes <out>/varlen-tiles-<device-slug>.json after every batch.
"""

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks import (CONFIG_KEYS, DEFAULT_OUT, RECORD_KEYS, device_slug, log, run_meta,  # noqa: E402
                        time_ms, write_results)
from benchmarks.serving import _check_and_time, _timer  # noqa: E402  (the varlen part's check and timing)
from kernels import flash_attention, flash_attention_varlen  # noqa: E402
from kernels import varlen as varlen_launch  # noqa: E402
from kernels.runtime import interpreting  # noqa: E402

KIND = "varlen_tiles"
RECORD_KEYS.setdefault(KIND, ("batch", "lens", "impl", "config", "default", "ms", "rel_err", "status"))
SEED = 0        # the mixed batch's lengths and every batch's values
BATCHES = {      # name -> lengths: the probe's seven
    "16x1024": [1024] * 16, "32x512": [512] * 32, "64x256": [256] * 64, "8x2048": [2048] * 8,
    "4x4096": [4096] * 4, "ragged9": [8192, 4096, 3000, 2048, 1024, 512, 256, 100, 1],  # serving's --lens
    "mixed32": torch.randint(64, 2049, (32,), generator=torch.Generator().manual_seed(SEED)).tolist()}
SMOKE_BATCHES = {"3x16": [16] * 3, "ragged3": [40, 17, 1]}
FLEX, DENSE = "flex document", "dense padded"


def parse_variants(text: str) -> list[tuple[int, int, int, int]]:
    """Arguments: text, comma-separated block_m/block_n/num_warps/num_stages items ('' for none).
    Returns: the (block_m, block_n, num_warps, num_stages) tuples. Raises SystemExit (one line) on a
    malformed item."""
    out = []
    for item in filter(None, text.replace(" ", "").split(",")):
        parts = item.split("/")
        if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise SystemExit(f"error: --variants item {item!r} is not block_m/block_n/num_warps/num_stages, e.g. 64/64/4/3")
        out.append(tuple(int(p) for p in parts))
    return out


def default_tiles(lens: list, heads: int, head_dim: int, dtype) -> tuple[int, int, int, int]:
    """Arguments: the batch's lengths, heads, head_dim and dtype of a causal packed call.
    Returns: (block_m, block_n, num_warps, num_stages) the default call (no tile arguments) launches."""
    lp = varlen_launch._launch(varlen_launch._mask_spec("causal"), len(lens), sum(lens), max(lens), max(lens),
                               heads, head_dim, dtype, False, 1, None, None, None, None, interpreting())
    return lp.block_m, lp.block_n, lp.num_warps, lp.num_stages


def reference64(q, k, v, lens: list) -> torch.Tensor:
    """Arguments: packed q (total, H, D), k and v (total, H_kv, D); lens, the sequence lengths.
    Returns: float64 causal attention per sequence (total, H, D), one KV head's query group at a time."""
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    group, start = q.shape[1] // k.shape[1], 0
    for n in lens:
        s = slice(start, start + n)
        hidden = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        for g in range(k.shape[1]):
            qh = q[s, g * group:(g + 1) * group].transpose(0, 1).double()             # (group, n, D)
            kh, vh = (t[s, g].double() for t in (k, v))                                # (n, D)
            scores = (qh @ kh.T / q.shape[2] ** 0.5).masked_fill_(hidden, float("-inf"))
            out[s, g * group:(g + 1) * group] = (scores.softmax(-1) @ vh).transpose(0, 1)
        start += n
    return out


def batch_records(name: str, lens: list, variants: list, args, device, shape) -> list[dict]:
    """Arguments: name and lens of one batch; variants (parse_variants); args (rounds); device;
    shape (heads, kv_heads, head_dim, dtype name, torch dtype).
    Returns: one record per implementation (status, rel_err against float64, ms, tflops, speed_vs_flex)."""
    h, h_kv, d, dtype_name, dtype = shape
    total, n_max, b = sum(lens), max(lens), len(lens)
    gen = torch.Generator(device=device).manual_seed(SEED)
    q = torch.randn(total, h, d, generator=gen, device=device, dtype=dtype)
    k, v = (torch.randn(total, h_kv, d, generator=gen, device=device, dtype=dtype) for _ in range(2))
    starts = [0, *torch.tensor(lens).cumsum(0).tolist()]
    cu = torch.tensor(starts, dtype=torch.int32, device=device)
    tiles = default_tiles(lens, h, d, dtype)
    configs = {f"varlen default ({'/'.join(map(str, tiles))})": tiles}
    calls = {next(iter(configs)): lambda: flash_attention_varlen(q, k, v, cu, cu, n_max, n_max)}
    for bm, bn, w, st in variants:
        configs[f"varlen {bm}/{bn}/{w}/{st}"] = (bm, bn, w, st)
        calls[f"varlen {bm}/{bn}/{w}/{st}"] = (lambda bm=bm, bn=bn, w=w, st=st: flash_attention_varlen(
            q, k, v, cu, cu, n_max, n_max, block_m=bm, block_n=bn, num_warps=w, num_stages=st))
    padded = [torch.zeros(b, t.shape[1], n_max, d, dtype=dtype, device=device) for t in (q, k, v)]
    for i in range(b):
        for p, t in zip(padded, (q, k, v)):
            p[i, :, :lens[i]] = t[starts[i]:starts[i + 1]].transpose(0, 1)
    calls[DENSE] = lambda: flash_attention(*padded, mask="causal")
    adapt = {DENSE: lambda o: torch.cat([o[i, :, :lens[i]].transpose(0, 1) for i in range(b)])}
    if device.type == "cuda":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        doc = torch.repeat_interleave(torch.arange(b, device=device), torch.tensor(lens, device=device))
        block_mask = create_block_mask(lambda bb, hh, qi, ki: (doc[qi] == doc[ki]) & (ki <= qi), None, None,
                                       total, total, device=device)
        flex = torch.compile(flex_attention, dynamic=False)
        qf, kf, vf = (t.transpose(0, 1)[None].contiguous() for t in (q, k, v))
        calls[FLEX] = lambda: flex(qf, kf, vf, block_mask=block_mask, enable_gqa=True)
        adapt[FLEX] = lambda o: o[0].transpose(0, 1)
    log(f"{name}: {b} sequences, {total} tokens (longest {n_max}); default call -> {next(iter(configs))}; "
        f"checking {len(calls)} implementations against float64, then timing {args.rounds} round(s)")
    base = {"batch": name, "lens": lens, "dtype": dtype_name, "heads": h, "kv_heads": h_kv, "head_dim": d,
            "mask": "causal", "err_ref": "float64"}
    timer = (lambda fn: time_ms(fn, device, warmup=10, rep=100)) if device.type == "cuda" else _timer(device)
    records = _check_and_time(calls, reference64(q, k, v, lens), base,
                              SimpleNamespace(dtype=dtype_name, repeats=args.rounds), timer, adapt)
    flops = sum(4 * h * d * n * (n + 1) // 2 for n in lens)
    flex_ms = records.get(FLEX, {}).get("ms")
    for impl, rec in records.items():
        cfg = configs.get(impl)
        rec.update(config=dict(zip(CONFIG_KEYS, cfg)) if cfg else None, default=impl.startswith("varlen default"))
        if rec["status"] != "ok":
            log(f"  {name:8s} {impl:28s} {rec['status']} {rec.get('error', '')} err {rec['rel_err']}")
            continue
        rec["tflops"] = flops / (rec["ms"] * 1e-3) / 1e12
        rec["speed_vs_flex"] = flex_ms / rec["ms"] if flex_ms else None
        vs_flex = f"{rec['speed_vs_flex']:5.2f}x flex" if flex_ms else "(no flex)"
        log(f"  {name:8s} {impl:28s} {rec['ms']:8.3f} ms {rec['tflops']:6.1f} TFLOP/s {vs_flex}  err {rec['rel_err']:.1e}")
    return list(records.values())


def build_parser() -> argparse.ArgumentParser:
    """Returns: the command line's parser."""
    p = argparse.ArgumentParser(prog="python scripts/varlen_tiles.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default=None, help=f"comma list of {', '.join(BATCHES)} (default: all; "
                   f"--cpu-smoke: {', '.join(SMOKE_BATCHES)})")
    p.add_argument("--variants", default=None, help="comma list of block_m/block_n/num_warps/num_stages "
                   "(default 64/64/4/3,128/64/8/3; --cpu-smoke 16/16/1/1)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    p.add_argument("--out", default=DEFAULT_OUT, help="directory for varlen-tiles-<device-slug>.json")
    p.add_argument("--budget-s", type=float, default=600, help="start no batch after this many seconds")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes in Triton's interpreter, no Flex")
    return p


def main(argv=None) -> int:
    """Arguments: argv (None: sys.argv[1:]). Returns: 0 once the file is written. Raises SystemExit
    (one line) without a GPU (and without --cpu-smoke) and on bad arguments."""
    args = build_parser().parse_args(argv)
    smoke = args.cpu_smoke
    if not smoke and (interpreting() or not torch.cuda.is_available()):
        raise SystemExit("error: no CUDA GPU (or TRITON_INTERPRET=1 is set): this script measures on a GPU; "
                         "--cpu-smoke checks it in Triton's interpreter")
    if smoke and not interpreting():
        raise SystemExit("error: --cpu-smoke runs in Triton's interpreter: set TRITON_INTERPRET=1")
    table = SMOKE_BATCHES if smoke else BATCHES
    names = (args.batches or ",".join(table)).replace(" ", "").split(",")
    if unknown := [n for n in names if n not in table]:
        raise SystemExit(f"error: unknown batch {', '.join(unknown)}; use some of {', '.join(table)}")
    if args.rounds < 1:
        raise SystemExit("error: --rounds must be at least 1")
    variants = parse_variants(args.variants if args.variants is not None else
                              "16/16/1/1" if smoke else "64/64/4/3,128/64/8/3")
    device = torch.device("cpu" if smoke else "cuda")
    shape = (2, 1, 16, "fp32", torch.float32) if smoke else (32, 8, 128, "bf16", torch.bfloat16)
    meta = run_meta(device, KIND, argv, "python scripts/varlen_tiles.py")
    meta.update(timing=("do_bench median (warmup 10 ms, rep 100 ms, L2 flushed between calls), median over "
                        f"{args.rounds} interleaved rounds" if not smoke else "interpreter smoke run (one wall-clock call)"),
                flop_convention="4 * H * D per visible (query, key) pair; causal: n (n + 1) / 2 per sequence",
                rel_err="relative Frobenius error against float64 attention per sequence (err_ref)")
    path = Path(args.out) / f"varlen-tiles-{device_slug(meta['device'])}.json"
    log(f"varlen tiles on {meta['device']}: batches {', '.join(names)}; variants "
        f"{', '.join('/'.join(map(str, v)) for v in variants) or 'none'}, and the default call")
    t0, records = time.time(), []
    for name in names:
        if time.time() - t0 > args.budget_s:
            log(f"budget of {args.budget_s:.0f} s spent: {name} and later batches skipped")
            break
        records += batch_records(name, table[name], variants, args, device, shape)
        write_results({"meta": meta, "records": records}, path, KIND)    # a later batch cut short loses only itself
        if device.type == "cuda":
            torch.cuda.empty_cache()
    log(f"wrote {path} ({len(records)} records, {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
