"""Training through the kernel: a small GPT on a synthetic copy task, trained three times from the
same seed on the same batches with its attention computed by (1) kernels.flash_attention in bf16,
(2) SDPA in bf16 and (3) SDPA in float32 (everything else float32). The check: at every step
|loss_ours - loss_sdpa_bf16| against |loss_sdpa_bf16 - loss_sdpa_fp32|, the gap bf16 attention
itself makes. Writes <out>/backward-training-<device-slug>.json (the three loss curves, per-step
gaps and a summary; also |loss_ours - loss_sdpa_fp32| against the same gap: whether ours is at
least as near float32 as SDPA's bf16).

    python scripts/training_check.py [--steps 300] [--out data/benchmarks] [--smoke]
    python scripts/training_check.py --plot data/benchmarks/backward-training-<slug>.json out.png

Task: each sequence is a random first half followed by the same tokens again, so the second
half is predictable only by attending back (an induction copy); the loss is taken on the second
half."""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels import flash_attention


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
        y = self.attend(q, k, v).transpose(1, 2).reshape(b, n, w)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, seq, width, heads, layers, attend):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads, attend) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def attention(kind):
    """(q, k, v) float32 (B, H, N, D) -> float32 output, causal."""
    if kind == "ours_bf16":
        return lambda q, k, v: flash_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask="causal").float()
    if kind == "sdpa_bf16":
        return lambda q, k, v: F.scaled_dot_product_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(),
                                                              is_causal=True).float()
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)


def batches(steps, batch, seq, vocab, device, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    for _ in range(steps):
        half = torch.randint(0, vocab, (batch, seq // 2), generator=g)
        yield torch.cat([half, half], 1).to(device)


def train(kind, args, device):
    torch.manual_seed(args.seed)
    model = GPT(args.vocab, args.seq, args.width, args.heads, args.layers, attention(kind)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    losses = []
    start = time.perf_counter()
    for step, idx in enumerate(batches(args.steps, args.batch, args.seq, args.vocab, device, args.seed)):
        logits = model(idx[:, :-1])
        half = args.seq // 2
        loss = F.cross_entropy(logits[:, half - 1:].reshape(-1, args.vocab), idx[:, half:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % max(1, args.steps // 10) == 0:
            print(f"{kind:10s} step {step:4d} loss {losses[-1]:.4f}", flush=True)
    return losses, time.perf_counter() - start


def plot(json_path, png_path):
    """The loss curves and the per-step gaps of a result file, as a PNG (plotly + kaleido)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    d = json.loads(Path(json_path).read_text())
    m = d["meta"]["model"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        f"training loss (copy task, {m['layers']}-layer GPT, D {m['width'] // m['heads']})", "per-step loss gap"))
    names = {"ours_bf16": "ours (bf16)", "sdpa_bf16": "SDPA bf16", "sdpa_fp32": "SDPA fp32"}
    for kind, losses in d["losses"].items():
        fig.add_trace(go.Scatter(y=losses, name=names[kind], mode="lines"), 1, 1)
    fig.add_trace(go.Scatter(y=d["gap_ours"], name="|ours - SDPA bf16|", mode="lines"), 1, 2)
    fig.add_trace(go.Scatter(y=d["gap_bf16_vs_fp32"], name="|SDPA bf16 - SDPA fp32|", mode="lines"), 1, 2)
    fig.update_yaxes(type="log")
    fig.update_xaxes(title="step")
    fig.update_layout(width=1200, height=450, title=f"Training through the kernel, {d['meta']['device']}")
    fig.write_image(png_path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"), help="draw a result file's curves and stop")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default="data/benchmarks")
    ap.add_argument("--smoke", action="store_true", help="a few steps of a tiny model on the CPU interpreter")
    args = ap.parse_args()
    if args.plot:
        return plot(*args.plot)
    device = "cpu" if args.smoke else "cuda"
    size = dict(vocab=16, seq=32, width=32, heads=2, layers=1, batch=2, steps=3) if args.smoke else \
        dict(vocab=64, seq=256, width=256, heads=4, layers=4, batch=32, steps=args.steps)
    for key, value in dict(size, lr=1e-3, seed=0).items():
        setattr(args, key, value)
    runs = {kind: train(kind, args, device) for kind in ("ours_bf16", "sdpa_bf16", "sdpa_fp32")}
    ours, bf16, fp32 = (runs[k][0] for k in ("ours_bf16", "sdpa_bf16", "sdpa_fp32"))
    gap_ours = [abs(a - b) for a, b in zip(ours, bf16)]
    gap_bf16 = [abs(a - b) for a, b in zip(bf16, fp32)]
    gap_ours_fp32 = [abs(a - b) for a, b in zip(ours, fp32)]
    within = [g <= r for g, r in zip(gap_ours, gap_bf16)]
    within_fp32 = [g <= r for g, r in zip(gap_ours_fp32, gap_bf16)]
    name = torch.cuda.get_device_name() if device == "cuda" else "interpreter"
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    summary = dict(steps_within=sum(within), steps=len(within), steps_ours_nearer_fp32=sum(within_fp32),
                   max_gap_ours=max(gap_ours), max_gap_bf16_vs_fp32=max(gap_bf16),
                   mean_gap_ours=sum(gap_ours) / len(gap_ours), mean_gap_bf16_vs_fp32=sum(gap_bf16) / len(gap_bf16),
                   final_loss={k: runs[k][0][-1] for k in runs}, seconds={k: runs[k][1] for k in runs},
                   loss_at_start=math.log(args.vocab))
    result = dict(meta=dict(device=name, torch_version=torch.__version__, model=size, lr=args.lr, seed=args.seed,
                            task="copy: a random first half repeated; loss on the second half",
                            check="|loss_ours_bf16 - loss_sdpa_bf16| <= |loss_sdpa_bf16 - loss_sdpa_fp32| per step"),
                  summary=summary, losses={k: runs[k][0] for k in runs}, gap_ours=gap_ours,
                  gap_ours_vs_fp32=gap_ours_fp32, gap_bf16_vs_fp32=gap_bf16)
    path = Path(args.out) / f"backward-training-{slug}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1), f"\nwrote {path}", flush=True)


if __name__ == "__main__":
    main()
