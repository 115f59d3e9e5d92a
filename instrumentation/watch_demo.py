"""`python -m instrumentation.watch_demo`: a tiny transformers Llama (random weights, no download)
trained on random tokens for about a minute, watched (instrumentation.watch), so the dashboard's
Model run page can be seen following a job as it runs.

    python -m instrumentation.watch_demo                      # GPU if there is one, else the interpreter
    tilescope-app --watch runs/watch-demo                     # in another shell: the URL is printed

On a GPU the traced kernels' times are measured; in Triton's CPU interpreter (TRITON_INTERPRET=1,
set here when there is no GPU) they are modelled, and each traced step takes seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def tiny_llama(device: str, layers: int = 2, seed: int = 0):
    """A small random-weight LlamaForCausalLM on Tilescope's attention, in training mode."""
    import torch
    import transformers

    from . import hf

    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      head_dim=16, max_position_embeddings=256, attn_implementation="eager")
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(device)
    hf.use_tilescope(model)
    return model.train()


def main(argv=None) -> int:
    """Train the tiny model watched; print where to look. Arguments: the command line (argv).
    Returns: the exit status."""
    ap = argparse.ArgumentParser(prog="python -m instrumentation.watch_demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/watch-demo", help="the run directory (new or empty)")
    ap.add_argument("--seconds", type=float, default=60.0, help="train this long (default 60)")
    ap.add_argument("--steps", type=int, default=None, help="or this many steps")
    ap.add_argument("--every", type=int, default=None, help="trace every k-th step (default 5 on CPU, 50 on GPU)")
    ap.add_argument("--tokens", type=int, default=None, help="sequence length (default 64 on CPU, 1024 on GPU)")
    ap.add_argument("--port", type=int, default=8501)
    args = ap.parse_args(argv)
    import torch

    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from .watch import watch

    device = "cuda" if cuda else "cpu"
    every = args.every or (50 if cuda else 5)
    n = args.tokens or (1024 if cuda else 64)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        print(f"watch_demo: {out} is not empty; pass --out NEW_DIR", file=sys.stderr)
        return 2
    model = tiny_llama(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator(device="cpu").manual_seed(1)
    print(f"training a tiny Llama on {'the GPU' if cuda else 'the CPU interpreter (modelled times)'}, "
          f"tracing every {every}th step into {out}")
    print(f"open it live:  tilescope-app --watch {out}   then  "
          f"http://localhost:{args.port}/model_run?mr_run={out.resolve().name}", flush=True)
    t0, step = time.time(), 0
    with watch(model, out, every=every, heads=[0], backward=True) as w:
        while (step < args.steps) if args.steps is not None else (time.time() - t0 < args.seconds):
            ids = torch.randint(0, 128, (2, n), generator=gen).to(device)
            loss = model(ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            if step % every == 0:
                print(f"step {step}  loss {loss.item():.3f}  ({time.time() - t0:.0f}s)", flush=True)
            step += 1
    print(f"done: {step} steps, {w.steps_written} traced. ModelRun.load({str(out)!r}) reads it.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
