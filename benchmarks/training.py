"""Training through the kernel: a 4-layer GPT (D 64 per head) on a synthetic copy task, trained
from one seed on the same batches with its attention computed by our kernel in bf16, by SDPA in
bf16 under each of its CUDA backends (cuDNN, FLASH, EFFICIENT) and by SDPA in float32
(everything else float32). Writes data/benchmarks/backward-training-<device-slug>.json.

    python -m benchmarks.training [--steps 300] [--out data/benchmarks]
    python -m benchmarks.training --plot data/benchmarks/backward-training-<slug>.json docs/img/backward-training-<slug>.png
    python -m benchmarks.training --device cpu      # a few steps of a tiny model in the interpreter

Three per-step checks, all recorded:
- issue: |loss_ours - loss_SDPA,bf16| <= |loss_SDPA,bf16 - loss_SDPA,fp32| (SDPA bf16: the FLASH
  backend). Two independently rounded runs compared against the gap of one of them: where both
  gaps are rounding noise (the plateau before the loss drops, differences of a few float32 ulps,
  some exactly 0) this holds on a coin toss, whatever the kernel.
- band: |loss_ours - loss_fp32| <= max over the SDPA bf16 backends of |loss_SDPA,bf16 - loss_fp32|,
  ours against the spread of PyTorch's own bf16 attentions at that step.
- same weights: along the float32 run, every step also takes the loss and the gradients of every
  weight with each bf16 attention at the float32 run's weights (no optimizer step), so errors do
  not compound; ours passes a step when its gradient error (relative, all weights) is at most
  twice the smallest of the SDPA bf16 backends', the tests' rule for same-precision attention.

Task: each sequence is a random first half followed by the same tokens again, so the second half
is predictable only by attending back (an induction copy); the loss is taken on the second half.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from pathlib import Path

import kernels  # noqa: F401  (first: picks the interpreter before triton is imported)
import torch
import torch.nn as nn
import torch.nn.functional as F

from instrumentation.trace import files
from kernels import flash_attention

from . import device_slug, log, pick_device, run_meta

GPU_SIZE = dict(vocab=64, seq=256, width=256, heads=4, layers=4, batch=32)
CPU_SIZE = dict(vocab=16, seq=32, width=32, heads=2, layers=1, batch=2)
SDPA_BACKENDS = {"sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_flash": "FLASH_ATTENTION",
                 "sdpa_efficient": "EFFICIENT_ATTENTION"}
ISSUE_PEER = "sdpa_flash"
GRAD_RATIO = 2.0
NAMES = {"ours_bf16": "ours (bf16)", "sdpa_cudnn": "SDPA cuDNN bf16", "sdpa_flash": "SDPA FLASH bf16",
         "sdpa_efficient": "SDPA EFFICIENT bf16", "sdpa_math": "SDPA math bf16", "sdpa_fp32": "SDPA fp32"}


class Block(nn.Module):
    def __init__(self, width, heads, attend):
        super().__init__()
        self.heads, self.attend = heads, attend
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        b, n, w = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        y = self.attend[0](q, k, v).transpose(1, 2).reshape(b, n, w)     # (B, N, width)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """attend: a one-item list holding (q, k, v) float32 (B, H, N, D) -> float32 output, causal;
    swapping its item changes every block's attention (the same-weights check)."""

    def __init__(self, vocab, seq, width, heads, layers, batch, attend):
        super().__init__()
        self.attend = [attend]
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads, self.attend) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def attention(kind):
    """(q, k, v) float32 (B, H, N, D) -> float32 output, causal, for one kind of run."""
    if kind == "ours_bf16":
        return lambda q, k, v: flash_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask="causal").float()
    if kind == "sdpa_fp32":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ctx = contextlib.nullcontext
    if kind in SDPA_BACKENDS:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        ctx = lambda: sdpa_kernel(getattr(SDPBackend, SDPA_BACKENDS[kind]))  # noqa: E731

    def call(q, k, v):
        with ctx():
            return F.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), is_causal=True).float()
    return call


def batches(steps, batch, seq, vocab, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    for _ in range(steps):
        half = torch.randint(0, vocab, (batch, seq // 2), generator=g)
        yield torch.cat([half, half], 1).to(device)


def loss_of(model, idx, size):
    half = size["seq"] // 2
    logits = model(idx[:, :-1])
    return F.cross_entropy(logits[:, half - 1:].reshape(-1, size["vocab"]), idx[:, half:].reshape(-1))


def train(kind, size, steps, lr, seed, device, shadow=()):
    """Losses of one run; with shadow kinds (the float32 run), also per step each shadow kind's
    loss and relative gradient error at this run's weights. Returns (losses, shadow, seconds)."""
    torch.manual_seed(seed)
    model = GPT(**size, attend=attention(kind)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses, same = [], {s: dict(loss=[], grad_err=[]) for s in shadow}
    start = time.perf_counter()
    for step, idx in enumerate(batches(steps, size["batch"], size["seq"], size["vocab"], device, seed)):
        loss = loss_of(model, idx, size)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if shadow:
            ref = torch.cat([p.grad.flatten() for p in model.parameters()])
            for s in shadow:
                model.attend[0] = attention(s)
                other = loss_of(model, idx, size)
                grads = torch.autograd.grad(other, list(model.parameters()))
                model.attend[0] = attention(kind)
                err = float((torch.cat([g.flatten() for g in grads]) - ref).norm() / ref.norm())
                same[s]["loss"].append(other.item())
                same[s]["grad_err"].append(err)
        opt.step()
        losses.append(loss.item())
        if step % max(1, steps // 5) == 0:
            log(f"{kind:14s} step {step:4d} loss {losses[-1]:.4f}")
    return losses, same, time.perf_counter() - start


def checks(runs, shadow, peers):
    """The three per-step checks (see the module doc) and their summary."""
    ours, fp32 = runs["ours_bf16"], runs["sdpa_fp32"]
    issue_peer = ISSUE_PEER if ISSUE_PEER in runs else peers[0]
    gap_issue = [abs(a - b) for a, b in zip(ours, runs[issue_peer])]
    bound_issue = [abs(a - b) for a, b in zip(runs[issue_peer], fp32)]
    gap_ours = [abs(a - b) for a, b in zip(ours, fp32)]
    band = [max(abs(runs[p][t] - fp32[t]) for p in peers) for t in range(len(fp32))]
    err_ours = shadow["ours_bf16"]["grad_err"]
    err_sdpa = [min(shadow[p]["grad_err"][t] for p in peers) for t in range(len(err_ours))]
    per_step = dict(gap_issue=gap_issue, bound_issue=bound_issue, gap_ours_vs_fp32=gap_ours, band=band,
                    grad_err_ours=err_ours, grad_err_sdpa_min=err_sdpa)
    n = len(fp32)
    summary = dict(
        steps=n, issue_peer=issue_peer,
        issue_steps_within=sum(g <= b for g, b in zip(gap_issue, bound_issue)),
        issue_steps_bound_zero=sum(b == 0 for b in bound_issue),
        band_steps_within=sum(g <= b for g, b in zip(gap_ours, band)),
        same_weights_steps_within=sum(e <= GRAD_RATIO * s for e, s in zip(err_ours, err_sdpa)),
        same_weights_max_ratio=max(e / s for e, s in zip(err_ours, err_sdpa) if s > 0),
        same_weights_median_grad_err={k: sorted(v["grad_err"])[n // 2] for k, v in shadow.items()},
        final_loss={k: v[-1] for k, v in runs.items()})
    return per_step, summary


def run(args, argv) -> dict:
    device = pick_device(args.device)
    cuda = device.type == "cuda"
    size = dict(GPU_SIZE if cuda else CPU_SIZE)
    steps = args.steps if cuda else min(args.steps, 3)
    peers = list(SDPA_BACKENDS) if cuda else ["sdpa_math"]
    lr, seed = 1e-3, args.seed
    runs, seconds = {}, {}
    for kind in ["ours_bf16", *peers]:
        runs[kind], _, seconds[kind] = train(kind, size, steps, lr, seed, device)
    runs["sdpa_fp32"], shadow, seconds["sdpa_fp32"] = train("sdpa_fp32", size, steps, lr, seed, device,
                                                             shadow=["ours_bf16", *peers])
    per_step, summary = checks(runs, shadow, peers)
    summary["seconds"] = seconds
    summary["loss_at_start"] = math.log(size["vocab"])
    meta = run_meta(device, "training", argv, prog="python -m benchmarks.training")
    meta.update(model=dict(size, head_dim=size["width"] // size["heads"]), steps=steps, lr=lr, seed=seed,
                optimizer="AdamW, float32 weights", peers=peers,
                task="copy: a random first half repeated; loss on the second half",
                checks={"issue": "|loss_ours - loss_sdpa_bf16| <= |loss_sdpa_bf16 - loss_fp32|",
                        "band": "|loss_ours - loss_fp32| <= max over SDPA bf16 backends |loss_bf16 - loss_fp32|",
                        "same_weights": f"grad error of ours <= {GRAD_RATIO} x the smallest SDPA bf16 backend's, "
                                        "all at the float32 run's weights"})
    result = dict(meta=meta, summary=summary, losses=runs, same_weights=shadow, per_step=per_step)
    path = Path(args.out) / f"backward-training-{device_slug(meta['device'])}.json"
    files.write_json_atomic(path, files.json_safe(result))
    log("\n".join(f"{k}: {v}" for k, v in summary.items() if k != "seconds") + f"\nwrote {path}")
    return result


COLORS = {"ours_bf16": "#d62728", "sdpa_cudnn": "#1f77b4", "sdpa_flash": "#2ca02c", "sdpa_efficient": "#9467bd",
          "sdpa_math": "#9467bd", "sdpa_fp32": "#000000"}


def plot(json_path, png_path):
    """The loss curves, each bf16 run's per-step loss gap to the float32 run and the
    same-weights gradient errors of a result file, as one PNG (plotly + kaleido); one colour per
    implementation, ours drawn last and thicker."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    d = files.read_json(json_path, f"result file '{json_path}'")
    m, s = d["meta"], d["summary"]
    fp32 = d["losses"]["sdpa_fp32"]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.07, subplot_titles=(
        f"training loss ({m['model']['layers']}-layer GPT, D {m['model']['head_dim']}, copy task)",
        f"|loss − loss fp32| per step (ours inside the SDPA bf16 spread: {s['band_steps_within']}/{s['steps']})",
        f"same weights: gradient error (ours ≤ {GRAD_RATIO:g}x SDPA's: {s['same_weights_steps_within']}/{s['steps']})"))
    kinds = sorted(d["losses"], key=lambda k: (k == "ours_bf16", k))          # ours on top
    for kind in kinds:
        line = dict(color=COLORS.get(kind), width=2.5 if kind == "ours_bf16" else 1.2,
                    dash="dash" if kind == "sdpa_fp32" else None)
        common = dict(name=NAMES.get(kind, kind), mode="lines", line=line, legendgroup=kind)
        fig.add_trace(go.Scatter(y=d["losses"][kind], showlegend=True, **common), 1, 1)
        if kind == "sdpa_fp32":
            continue
        gap = [abs(a - b) for a, b in zip(d["losses"][kind], fp32)]
        fig.add_trace(go.Scatter(y=gap, showlegend=False, **common), 1, 2)
        fig.add_trace(go.Scatter(y=d["same_weights"][kind]["grad_err"], showlegend=False, **common), 1, 3)
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text="cross-entropy (nats)", row=1, col=1)
    fig.update_yaxes(title_text="|Δ loss| (nats)", row=1, col=2)
    fig.update_yaxes(title_text="‖g − g fp32‖ / ‖g fp32‖ (all weights)", row=1, col=3)
    fig.update_xaxes(title_text="step")
    fig.update_layout(width=1800, height=520, font=dict(size=13), legend=dict(orientation="h", y=-0.2),
                      title=f"Training through the kernel — recorded on {m['device']}, {m['date'][:10]} "
                            f"(torch {m['torch_version']}; bf16 attention, float32 weights and the rest)")
    fig.write_image(png_path)
    return png_path


def main(argv=None) -> int:
    from instrumentation.cli.args import run_guarded

    argv = sys.argv[1:] if argv is None else list(argv)
    from instrumentation.cli.args import MAX_SEED, OneLineParser, bounded_int

    ap = OneLineParser(prog="python -m benchmarks.training", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"), help="draw a result file's curves and stop")
    ap.add_argument("--steps", type=bounded_int(1, 100_000), default=300)
    ap.add_argument("--seed", type=bounded_int(0, MAX_SEED), default=0)
    ap.add_argument("--out", default="data/benchmarks")
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    args = ap.parse_args(argv)
    if args.plot:
        return run_guarded(lambda: (log(f"wrote {plot(*args.plot)}"), 0)[1])
    return run_guarded(lambda: (run(args, argv), 0)[1])


if __name__ == "__main__":
    sys.exit(main())
