"""First look on a GPU: compile, correctness, hardware trace, config sweep vs SDPA, overhead.

    python scripts/gpu_probe.py --out $OUT
Writes probe.json under --out and prints a table; used to choose kernel defaults.
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from instrumentation import environment, make_inputs, record  # noqa: E402
from kernels import flash_attention  # noqa: E402


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out")
    ap.add_argument("--configs", default="128,128,8,3;128,64,8,3;128,128,8,2;64,64,4,3;128,64,8,4")
    ap.add_argument("--seq-lens", default="4096,16384")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"env": environment("cuda"), "runs": [], "errors": []}
    dev = "cuda"
    B, H, D = 4, 16, 128
    q, k, v = make_inputs(1, 2, 4096, 128, "bf16", 0, dev)
    t0 = time.time()
    o = flash_attention(q, k, v, mask="causal")
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    print("compile+run", time.time() - t0, "err", ((o.float() - ref.float()).norm() / ref.float().norm()).item(), flush=True)
    _, tr = record(q, k, v, mask="causal")
    print(tr.work.head(), tr.work.sm.nunique(), tr.meta["untraced_ms"], tr.meta["traced_ms"], flush=True)
    tr.save(out / "probe-trace", force=True)       # this probe's own output from a previous run
    for n in [int(x) for x in args.seq_lens.split(",")]:
        q, k, v = make_inputs(B, H, n, D, "bf16", seed=n, device=dev, per_head=False)
        for causal in (False, True):
            flops = 4 * B * H * n * n * D * (0.5 if causal else 1.0)
            row = {"n": n, "causal": causal}
            for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
                with sdpa_kernel(be):
                    ms = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                row[name] = flops / ms / 1e9
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal).float()
            for cfg, sched, tma in [(c, sc, t) for c in args.configs.split(";") for t in (False, True)
                                    for sc in (("natural", "longest_first", "persistent") if causal else ("natural",))]:
                bm, bn, w, s = (int(x) for x in cfg.split(","))
                if True:
                    kw = dict(mask="causal" if causal else "full", block_m=bm, block_n=bn, num_warps=w,
                              num_stages=s, schedule=sched, use_tma=tma)
                    sched = sched + ("+tma" if tma else "")
                    try:
                        o = flash_attention(q, k, v, **kw)
                        err = ((o.float() - ref).norm() / ref.norm()).item()
                        ms = bench(lambda: flash_attention(q, k, v, **kw))
                        row[f"{cfg}/{sched}"] = flops / ms / 1e9
                        if err > 2e-2:
                            res["errors"].append({"cfg": cfg, "n": n, "err": err})
                    except Exception as exc:  # noqa: BLE001
                        res["errors"].append({"cfg": cfg, "n": n, "exc": repr(exc)[:300]})
            res["runs"].append(row)
            best = max((kk for kk in row if "/" in kk), key=lambda kk: row[kk], default=None)
            print(n, "causal" if causal else "full", f"cudnn {row['cudnn']:.0f} fa2 {row['fa2']:.0f}",
                  "best", best, f"{row.get(best, 0):.0f}", flush=True)
            (out / "probe.json").write_text(json.dumps(res, indent=1, default=str))
    # tracing overhead, one run, same inputs
    for n, mask in ((4096, "causal"), (4096, "full"), (16384, "causal")):
        q, k, v = make_inputs(B, H, n, D, "bf16", 1, dev)
        _, tw = record(q, k, v, mask=mask, level="work")
        _, tf = record(q, k, v, mask=mask, level="full")
        res.setdefault("overhead", []).append({
            "mask": mask, "untraced_ms_a": tw.meta["untraced_ms"], "work_ms": tw.meta["traced_ms"],
            "untraced_ms_b": tf.meta["untraced_ms"], "full_ms": tf.meta["traced_ms"]})
        print("overhead", res["overhead"][-1], flush=True)
    (out / "probe.json").write_text(json.dumps(res, indent=1, default=str))
    for r in res["runs"]:
        print({k_: (round(v_) if isinstance(v_, float) else v_) for k_, v_ in r.items()})
    print("errors", res["errors"])


if __name__ == "__main__":
    main()
