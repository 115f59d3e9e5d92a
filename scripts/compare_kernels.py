"""This tree's kernels against an earlier copy, on a GPU, in one process (scripts/kernels_gpu_run.sh step 2).

    python scripts/compare_kernels.py OLD_TREE NEW_TREE OUT.json fwd,bwd,dec,fp8[,host][,persistent]

OLD_TREE / NEW_TREE: folders holding a kernels/ package (e.g. `git archive <commit> kernels | tar -x -C
.old && echo <commit> > .old/COMMIT`); the old one is imported as `kernels_old`. The result's meta
names the commits: OLD_COMMIT or OLD_TREE/COMMIT, NEW_COMMIT or TILESCOPE_COMMIT. Per case: do_bench
medians in the order (old, new, new, old) x 3, the outputs compared bit for bit (forward O; backward dQ, dK, dV; decode O; FP8: the attention kernel
alone, on inputs each tree's quantise pass made), and at the end the
compiled PTX of every kernel, instructions only (parameters, line info and register numbers aside).
persistent (only when named): the bf16 forward at schedule="persistent" (on Hopper the persistent Gluon
kernel), the cases of PERSISTENT. host (only when named): host microseconds per flash_attention_backward call (B1 H8 N1024, where the host
time is the call), the median of 200 unsynchronised calls, in the order (old, new, new, old) x 5."""
import importlib
import json
import os
import re
import shutil
import statistics
import sys

import torch
import triton
import triton.testing

old_root, new_root, out_path, parts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(",")


def _commit_file(root):
    """The commit a copied tree says it is (root/COMMIT), or None."""
    path = os.path.join(root, "COMMIT")
    if not os.path.isfile(path):
        return None
    return open(path).read().strip() or None

shutil.rmtree("/tmp/ko", ignore_errors=True)
os.makedirs("/tmp/ko")
shutil.copytree(os.path.join(old_root, "kernels"), "/tmp/ko/kernels_old")
sys.path.insert(0, new_root)
sys.path.insert(0, "/tmp/ko")
from kernels import flash_attention as new_fa, flash_decode as new_dec
from kernels_old import flash_attention as old_fa, flash_decode as old_dec
FWD = [  # B, H, H_kv, N, D, mask, schedule
    (4, 16, 16, 4096, 64, "full", "natural"), (4, 16, 16, 4096, 64, "causal", "natural"),
    (4, 16, 16, 8192, 64, "full", "natural"), (4, 16, 16, 8192, 64, "causal", "natural"),
    (4, 16, 16, 4096, 128, "full", "natural"), (4, 16, 16, 4096, 128, "causal", "natural"),
    (4, 16, 16, 8192, 128, "full", "natural"), (4, 16, 16, 8192, 128, "causal", "natural"),
    (2, 32, 8, 4096, 128, "full", "natural"), (2, 32, 8, 8192, 128, "causal", "natural"),
    (2, 16, 16, 4096, 256, "full", "natural"), (2, 16, 16, 4096, 256, "causal", "natural"),
    (4, 16, 16, 4096, 80, "causal", "natural"), (4, 16, 16, 8192, 128, "causal", "longest_first"),
    (4, 16, 16, 8192, 128, "causal", "persistent"), (4, 16, 16, 4096, 64, "full", "persistent"),
    (4, 16, 16, 16384, 128, "causal", "natural"), (2, 16, 16, 4096, 128, "sliding_window:1024", "natural"),
]
PERSISTENT = [(b, h, hkv, n, d, mask, "persistent") for b, h, hkv, n, d, mask in (
    (4, 16, 16, 4096, 128, "full"), (4, 16, 16, 8192, 128, "full"), (4, 16, 16, 4096, 128, "causal"),
    (4, 16, 16, 8192, 128, "causal"), (4, 16, 16, 16384, 128, "causal"), (2, 32, 8, 8192, 128, "causal"),
    (4, 16, 16, 8192, 64, "causal"))]
BWD = [(4, 16, 16, 4096, 128, "full"), (4, 16, 16, 4096, 128, "causal"), (4, 16, 16, 8192, 64, "causal"),
       (2, 32, 8, 8192, 128, "causal"), (2, 16, 16, 4096, 256, "causal"), (4, 16, 16, 4096, 80, "causal")]
FP8 = [  # B, H, H_kv, N, D, mask
    (4, 16, 16, 4096, 128, "full"), (4, 16, 16, 8192, 128, "full"), (4, 16, 16, 4096, 128, "causal"),
    (4, 16, 16, 8192, 128, "causal"), (4, 16, 16, 16384, 128, "causal"), (2, 32, 8, 8192, 128, "causal"),
    (4, 16, 16, 4096, 256, "full"), (4, 16, 16, 4096, 256, "causal"), (4, 16, 16, 8192, 256, "causal")]
HOST = [(1, 8, 1024, 64, "causal"), (1, 8, 1024, 64, "full"), (1, 8, 1024, 128, "causal"), (1, 8, 1024, 128, "full")]
DEC = [  # B, H, H_kv, N_ctx, D, page_size (0 = contiguous)
    (1, 32, 8, 32768, 128, 0), (8, 32, 8, 8192, 128, 0), (64, 32, 8, 4096, 128, 0), (1, 32, 8, 131072, 128, 0),
    (1, 32, 8, 32768, 128, 16), (8, 32, 8, 8192, 128, 64), (32, 32, 8, 8192, 128, 256)]


def bench(fns):
    ms = {"old": [], "new": []}
    for name in ("old", "new", "new", "old") * 3:
        ms[name].append(triton.testing.do_bench(fns[name], warmup=25, rep=100, return_mode="median"))
    return ms


rows = []
def record(kind, case, fns, outs):
    ms = bench(fns)
    same = all(torch.equal(a, b) for a, b in zip(outs["old"], outs["new"]))
    r = dict(kind=kind, case=case, old_ms=statistics.median(ms["old"]), new_ms=statistics.median(ms["new"]),
             old_runs=ms["old"], new_runs=ms["new"], bit_identical=same)
    r["speed_new_over_old"] = r["old_ms"] / r["new_ms"]
    rows.append(r)
    print(f"{kind} {case}: old {r['old_ms']:.3f} new {r['new_ms']:.3f} ms  new/old speed "
          f"{r['speed_new_over_old']:.3f}x  bit-identical {same}", flush=True)


g = torch.Generator(device="cuda")
if "host" in parts:     # benchmarks.overhead's timing: 20 warm-up calls, then the median of 200 unsynchronised
    from benchmarks.overhead import host_us
    from kernels.backward import flash_attention_backward as new_bwd
    from kernels_old.backward import flash_attention_backward as old_bwd
    cuda = torch.device("cuda")
    for b, h, n, d, mask in HOST:
        g.manual_seed(n + d + 3)
        q, k, v, do = (torch.randn(b, h, n, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        o, lse = new_fa(q, k, v, mask=mask, return_lse=True)
        fns = {"old": lambda: old_bwd(do, q, k, v, o, lse, mask), "new": lambda: new_bwd(do, q, k, v, o, lse, mask)}
        outs = {name: list(fn()) for name, fn in fns.items()}
        us = {"old": [], "new": []}
        for name in ("old", "new", "new", "old") * 5:
            us[name].append(host_us({name: fns[name]}, 200, cuda, rounds=1)[name]["median_us"])
        r = dict(kind="host", case=f"B{b} H{h} N{n} D{d} {mask} backward", old_us=statistics.median(us["old"]),
                 new_us=statistics.median(us["new"]), old_runs=us["old"], new_runs=us["new"],
                 bit_identical=all(torch.equal(x, y) for x, y in zip(outs["old"], outs["new"])))
        r["host_new_over_old"] = r["new_us"] / r["old_us"]
        rows.append(r)
        print(f"host {r['case']}: old {r['old_us']:.1f} new {r['new_us']:.1f} us per call  new/old "
              f"{r['host_new_over_old']:.3f}  bit-identical {r['bit_identical']}", flush=True)
if "fwd" in parts or "persistent" in parts:
    for b, h, hkv, n, d, mask, sched in (FWD if "fwd" in parts else []) + (PERSISTENT if "persistent" in parts else []):
        g.manual_seed(n + d + h)
        q = torch.randn(b, h, n, d, generator=g, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hkv, n, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        fns = {"old": lambda: old_fa(q, k, v, mask=mask, schedule=sched), "new": lambda: new_fa(q, k, v, mask=mask, schedule=sched)}
        outs = {name: [fn()] for name, fn in fns.items()}
        record("fwd", f"B{b} H{h}/{hkv} N{n} D{d} {mask} {sched}", fns, outs)
if "bwd" in parts:
    for b, h, hkv, n, d, mask in BWD:
        g.manual_seed(n + d + h + 1)
        q = torch.randn(b, h, n, d, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_()
        k, v = (torch.randn(b, hkv, n, d, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(2))
        do = torch.randn(b, h, n, d, generator=g, device="cuda", dtype=torch.bfloat16)
        o_old = old_fa(q, k, v, mask=mask); o_new = new_fa(q, k, v, mask=mask)
        grads = lambda o: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
        fns = {"old": lambda: grads(o_old), "new": lambda: grads(o_new)}
        outs = {name: list(fn()) for name, fn in fns.items()}
        record("bwd", f"B{b} H{h}/{hkv} N{n} D{d} {mask}", fns, outs)
if "dec" in parts:
    for b, h, hkv, n, d, page in DEC:
        g.manual_seed(n + b + page)
        q = torch.randn(b, h, 1, d, generator=g, device="cuda", dtype=torch.bfloat16)
        if page:
            n_pages = b * n // page
            kc, vc = (torch.randn(n_pages, page, hkv, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            table = torch.randperm(n_pages, generator=g, device="cuda").view(b, n // page).to(torch.int32)
            lens = torch.full((b,), n, device="cuda", dtype=torch.int32)
            call = lambda fn: fn(q, kc, vc, cache_seqlens=lens, block_table=table)
        else:
            kc, vc = (torch.randn(b, hkv, n, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            call = lambda fn: fn(q, kc, vc)
        fns = {"old": lambda: call(old_dec), "new": lambda: call(new_dec)}
        outs = {name: [fn()] for name, fn in fns.items()}
        record("dec", f"B{b} H{h}/{hkv} N{n} D{d} page {page}", fns, outs)
if "fp8" in parts:
    from kernels.fp8 import attention_fp8 as new_fp8
    from kernels.fp8_quant import quantize_fp8 as new_quant
    from kernels_old.fp8 import attention_fp8 as old_fp8
    from kernels_old.fp8_quant import quantize_fp8 as old_quant
    for b, h, hkv, n, d, mask in FP8:
        g.manual_seed(n + d + h + 2)
        q = torch.randn(b, h, n, d, generator=g, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hkv, n, d, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        x_old, x_new = old_quant(q, k, v, mask=mask), new_quant(q, k, v, mask=mask)
        fns = {"old": lambda: old_fp8(x_old, mask), "new": lambda: new_fp8(x_new, mask)}
        outs = {name: [fn()] for name, fn in fns.items()}
        record("fp8", f"B{b} H{h}/{hkv} N{n} D{d} {mask}", fns, outs)


def instructions(compiled):
    keep = []
    for line in compiled.asm["ptx"].splitlines():
        t = line.strip()
        if not t or t.startswith((".", "//", "}", "{", ")", "$L__tmp")) or "_param_" in t:
            continue
        keep.append(re.sub(r"%(r|rd|f|p|rs|fd|hh|h|b)\d+", r"%\1", re.sub(r"\s+", " ", t)))
    return "\n".join(keep)


def compiled_set(fns):
    return sorted(instructions(c) for fn in fns for cache in fn.device_caches.values() for c in cache[0].values())


def kernels_of(pkg, names):
    found = []
    for mod_name, attr in names:
        try:
            found.append(getattr(importlib.import_module(f"{pkg}.{mod_name}"), attr))
        except (ImportError, AttributeError):
            pass
    return found
ptx = {}
KS = [("flash_kernel", "attn_fwd_kernel"), ("flash_kernel", "attn_fwd_persistent_kernel"),
      ("gluon_fwd_kernel", "attn_fwd_gluon_kernel"),   # the forward on Hopper
      ("backward_kernel", "attn_bwd_kernel"), ("backward_kernel", "attn_bwd_preprocess"),
      ("backward_dkdv_kernel", "attn_bwd_dkdv_kernel"), ("backward_dq_kernel", "attn_bwd_dq_kernel"),
      ("decode_kernel", "decode_split_kernel"), ("decode_kernel", "decode_merge_kernel"),
      ("gluon_bwd_onepass_kernel", "attn_bwd_onepass_gluon_kernel"), ("gluon_bwd_d256_kernel", "attn_bwd_d256_gluon_kernel"),
      ("gluon_bwd_kernel", "attn_bwd_dkdv_gluon_kernel"), ("gluon_bwd_kernel", "attn_bwd_dq_gluon_kernel"),
      ("fp8_kernel", "attn_fwd_fp8_kernel")]
groups = {"fwd": ("flash_kernel", "gluon_fwd_kernel"), "bwd": ("backward", "gluon_bwd"), "dec": ("decode",), "fp8": ("fp8_kernel",)}
for part, prefixes in groups.items():
    if part not in parts:
        continue
    sel = [k for k in KS if k[0].startswith(prefixes)]
    o, n = compiled_set(kernels_of("kernels_old", sel)), compiled_set(kernels_of("kernels", sel))
    same = o == n
    unmatched = sum(1 for x in n if x not in o)       # new compiled kernels with no identical old one
    ptx[part] = {"old": len(o), "new": len(n), "same_ptx_instructions": same, "new_without_identical_old": unmatched}
    print(f"{part}: compiled kernels old {len(o)}, new {len(n)}; same PTX instructions: {same}; "
          f"new ones without an identical old one: {unmatched}")
meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        # the commits compared: OLD_COMMIT or OLD_TREE/COMMIT (written beside a `git archive` copy), and
        # NEW_COMMIT or TILESCOPE_COMMIT (what the GPU runs set for their result files)
        "old": os.environ.get("OLD_COMMIT") or _commit_file(old_root),
        "new": os.environ.get("NEW_COMMIT") or os.environ.get("TILESCOPE_COMMIT"),
        "dtype": "bf16 (fp8: e4m3 from bf16 inputs, block scales + Hadamard)",
        "method": "per case: do_bench medians (warmup 25 ms, rep 100 ms) in the order (old, new, new, old) x 3 "
        "in one process; old_ms / new_ms = median of the six; speed_new_over_old = old_ms / new_ms; "
        "bit_identical: torch.equal of every output (forward O; backward dQ, dK, dV; decode O); host rows: "
        "host_us medians of 200 unsynchronised flash_attention_backward calls in the order (old, new, new, old) "
        "x 5, old_us / new_us = median of the ten, host_new_over_old = new_us / old_us"}
json.dump({"meta": meta, "cases": rows, "compiled": ptx}, open(out_path, "w"), indent=1)
timed = [r for r in rows if "speed_new_over_old" in r]       # the host part's rows compare host time
if timed:
    print("min speed new/old", round(min(r["speed_new_over_old"] for r in timed), 3), "all bit-identical",
          all(r["bit_identical"] for r in timed))
