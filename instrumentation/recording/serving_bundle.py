"""The serving recordings shipped under data/serving/ (a GPU run; `--device cpu --small` makes a
tiny interpreter version for tests), written by

    python -m instrumentation.regenerate --out data --only serving

decode_paged_b8_prefix4k_page64   one paged decode step (record_decode with a block table): 8
                                  sequences of ragged lengths 4.2k..32k whose first 4096 keys are
                                  the same 64 pages of 64 (a shared system prompt, so no sequence
                                  is shorter), the rest their own pages, every page at a random
                                  place in the pool;
                                  block-table entries past a sequence's last page are -1
varlen_causal_9seq                a packed causal prefill of 9 sequences of 37..8192 tokens
                                  (record_varlen)
padded_causal_9seq                the same 9 sequences padded to (9, H, 8192, D) and run by
                                  flash_attention (record, level 'work'): the padding's work items
                                  beside the packed batch's
All H 32 / H_kv 8, D 128, bf16, inputs from torch generators seeded with --seed.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import numpy as np
import torch

from kernels import backend

from .decode import record_decode
from .flash import record
from .varlen import record_varlen

DECODE_LENS = (4200, 5160, 6144, 8192, 11000, 16384, 23000, 32768)
PREFIX, PAGE = 4096, 64
VARLEN_LENS = (8192, 4096, 3000, 2048, 1024, 512, 256, 100, 37)
SMALL = {"decode_lens": (33, 40, 47, 70), "prefix": 32, "page": 16, "varlen_lens": (40, 17, 1, 33),
         "heads": 4, "kv_heads": 2, "head_dim": 16}
FULL = {"decode_lens": DECODE_LENS, "prefix": PREFIX, "page": PAGE, "varlen_lens": VARLEN_LENS,
        "heads": 32, "kv_heads": 8, "head_dim": 128}


def shared_prefix_cache(lens, prefix: int, page: int, h_kv: int, d: int, dtype, device, g):
    """A paged pool whose sequences share their first `prefix` keys' pages.

    Arguments:
        lens: keys per sequence; prefix: shared keys (a multiple of page); page: keys per page;
        h_kv, d, dtype, device: the pool's heads, head dim, dtype and device; g: a CPU generator.
    Returns:
        (k_pages, v_pages (num_pages, page, H_kv, D), block_table (B, max_pages) int32, -1 past
        each sequence's last page, prefix_pages: the shared pages' pool indices)."""
    if prefix % page or not 0 <= prefix <= min(lens):
        raise ValueError(f"the shared prefix ({prefix} keys) must be whole pages of {page} and no longer "
                         f"than the shortest sequence ({min(lens)})")
    shared = prefix // page
    per_seq = [-(-n // page) for n in lens]
    own = [max(0, p - shared) for p in per_seq]
    num_pages = shared + sum(own)
    place = torch.randperm(num_pages, generator=g)                         # logical order -> pool slot
    table = torch.full((len(lens), max(per_seq)), -1, dtype=torch.int32)
    prefix_pages = place[:shared]
    nxt = shared
    for b, p in enumerate(per_seq):
        table[b, :min(p, shared)] = prefix_pages[:min(p, shared)]
        table[b, shared:p] = place[nxt:nxt + own[b]]
        nxt += own[b]
    pools = [torch.randn(num_pages, page, h_kv, d, generator=g).to(dtype).to(device) for _ in range(2)]
    return pools[0], pools[1], table.to(device), prefix_pages.tolist()


def record_bundle(out: Path, device, small: bool = False, seed: int = 0, command: str = "") -> list[Path]:
    """Record and save the three serving traces under `out`; returns their paths."""
    cfg = SMALL if small else FULL
    h, h_kv, d = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    dtype = torch.float32 if small else torch.bfloat16
    g = torch.Generator().manual_seed(seed)
    extra = {"command": command} if command else {}
    paths = []
    # -- paged decode, shared prefix --
    lens = cfg["decode_lens"]
    k_pages, v_pages, table, prefix_pages = shared_prefix_cache(lens, cfg["prefix"], cfg["page"], h_kv, d,
                                                                dtype, device, g)
    q = torch.randn(len(lens), h, 1, d, generator=g).to(dtype).to(device)               # (B, H, 1, D)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    _, trace = record_decode(q, k_pages, v_pages, seqlens, block_table=table, measure=not small,
                             meta_extra={**extra, "serving": {"shared_prefix": cfg["prefix"],
                                                              "prefix_pages": prefix_pages}})
    paths.append(trace.save(out / f"decode_paged_b{len(lens)}_prefix{cfg['prefix'] // 1024 or cfg['prefix']}"
                                  f"{'k' if cfg['prefix'] >= 1024 else ''}_page{cfg['page']}"))
    # -- varlen prefill and the same batch padded --
    vl = cfg["varlen_lens"]
    total, n_max = sum(vl), max(vl)
    q, k, v = (torch.randn(total, heads, d, generator=g).to(dtype).to(device) for heads in (h, h_kv, h_kv))
    cu = torch.tensor([0, *np.cumsum(vl)], dtype=torch.int32, device=device)
    _, trace = record_varlen(q, k, v, cu, cu, n_max, n_max, mask="causal", measure=not small, meta_extra=extra)
    paths.append(trace.save(out / f"varlen_causal_{len(vl)}seq"))

    def padded(t):                                                                      # (B, H, n_max, D)
        p = torch.zeros(len(vl), t.shape[1], n_max, d, dtype=t.dtype, device=device)
        for i in range(len(vl)):
            p[i, :, :vl[i]] = t[int(cu[i]):int(cu[i + 1])].transpose(0, 1)
        return p

    _, trace = record(padded(q), padded(k), padded(v), mask="causal", level="work", measure=not small,
                      meta_extra={**extra, "padded_from": {"lengths": list(vl)}})
    paths.append(trace.save(out / f"padded_causal_{len(vl)}seq"))
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m instrumentation.recording.serving_bundle", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="data/serving")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--small", action="store_true", help="tiny shapes (for the interpreter)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.device == "cuda" and (backend() != "cuda" or not torch.cuda.is_available()):
        raise SystemExit("error: no CUDA GPU here; pass --device cpu --small for an interpreter version")
    if args.device == "cpu" and not args.small:
        raise SystemExit("error: the full-size bundle needs a GPU; pass --small with --device cpu")
    argv = sys.argv[1:] if argv is None else list(argv)
    command = " ".join(["python -m instrumentation.recording.serving_bundle", *map(shlex.quote, argv)])
    for path in record_bundle(Path(args.out), torch.device(args.device), args.small, args.seed, command):
        size = sum(f.stat().st_size for f in Path(path).iterdir())
        print(f"wrote {path} ({size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
