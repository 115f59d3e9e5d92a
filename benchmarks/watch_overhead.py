"""What watching costs a training job: a Llama-3-8B-shaped transformers model trained with
`instrumentation.watch(every=100)` against the same model trained unwatched, side by side in one
process, on the same batches. Writes data/benchmarks/watch-overhead-<device-slug>.json.

    python -m benchmarks.watch_overhead                  # H200/H100: B4 N4096 bf16, 200 timed steps each
    python -m benchmarks.watch_overhead --tiny           # the same code path in the interpreter, seconds

Two copies of one model (LlamaForCausalLM, Llama-3-8B's attention and embeddings: hidden 4096,
32 heads, 8 KV heads, head dim 128, vocab 128256; --layers layers, a --intermediate-wide MLP;
random weights from one seed, bf16, on Tilescope's attention), each with its own AdamW. One is
watched into a growing run (every=--every, backward=True, heads=[0]: tile detail of one head and
the traced backward, the heaviest watch the dashboard draws), the other is not. Both take the same
batches in the same order (a pool of --pool random batches of B x N tokens, labels = the tokens).

Timing: after --warmup steps each (the watched copy's warm-up includes its traced step 0, which
compiles the traced kernels and starts the watch's decoding process), the copies train in blocks
of --block steps, alternating A B B A ... (so drift in the GPU's clocks falls on both alike) until
each has --steps timed steps. A block is timed from a synchronised start to a synchronised end,
the watched block's end after w.flush(): the traced step's kernel runs (on the training thread)
and its decoding and saving (in the decoding process with --decode process, the default; on the
watcher's thread with --decode thread) are all inside the watched copy's time. With --block a
multiple of --every every watched block holds the same number of traced steps. The result: mean
step time of each copy (block time / steps), their ratio (goal <= 1.02; met only if no traced
step was skipped), per-step CUDA-event times (the traced steps stand out), the traced steps' own
cost as the run records it (step.json 'cost': snapshot_ms, launch_ms on the training thread,
decode_ms in the decoder), where the decoding ran ('decoder': mode, in_child, pid, whether torch
was loaded there), the traced steps skipped, each copy's losses, and the largest relative
difference between the two copies' weights at the end (watching changes no number of the
training: bf16 rounding of a nondeterministic backward at most).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import kernels  # noqa: F401  (first: picks the interpreter before triton is imported)
import torch

from . import DEFAULT_OUT, device_slug, log, pick_device, run_meta
from instrumentation.recording.model_bundle import LLAMA3_8B     # the one Llama-3-8B shape
from instrumentation.recording.timing import step_events
from instrumentation.trace import files

GOAL = 1.02
GPU = dict(batch=4, seq=4096, layers=4, intermediate=1024, steps=200, block=100, every=100, warmup=10, pool=8)
# the interpreter: a tiny Llama (the tests' size), a few steps, every=2
TINY = dict(batch=1, seq=16, layers=2, intermediate=64, steps=4, block=2, every=2, warmup=2, pool=2)
TINY_CONFIG = dict(vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   max_position_embeddings=64)


def build(config_kw: dict, layers: int, intermediate: int, device, dtype, seed: int):
    """A LlamaForCausalLM in training mode on Tilescope's attention, random weights from `seed`.

    Arguments: config_kw (LlamaConfig fields: the shape), layers, intermediate (MLP width),
    device, dtype, seed. Returns: the model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from instrumentation import hf

    config = LlamaConfig(num_hidden_layers=layers, intermediate_size=intermediate, attn_implementation="eager",
                         **config_kw)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model = model.to(dtype)
    hf.use_tilescope(model)
    return model.train()


class Arm:
    """One copy of the model and its optimizer, stepping through the shared batch pool."""

    def __init__(self, name: str, model, pool: list, device):
        self.name, self.model, self.pool, self.device = name, model, pool, device
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
        self.steps = 0
        self.losses: list = []           # tensors until the end (no sync per step)
        self.events: list = []           # (start, end) CUDA events of each timed step
        self.block_s: list = []          # seconds of each timed block
        self.watch = None

    def step(self, timed: bool) -> None:
        ids = self.pool[self.steps % len(self.pool)]
        cuda = self.device.type == "cuda"
        if timed and cuda:
            start, end = step_events()
            start.record()
        loss = self.model(ids, labels=ids).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if timed and cuda:
            end.record()
            self.events.append((start, end))
        self.losses.append(loss.detach())
        self.steps += 1

    def sync(self) -> None:
        if self.watch is not None:
            self.watch.flush()          # the watcher's queued steps: traced, decoded, saved
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def block(self, n: int) -> None:
        self.sync()
        t0 = time.perf_counter()
        for _ in range(n):
            self.step(timed=True)
        self.sync()
        self.block_s.append(time.perf_counter() - t0)


def order(blocks: int) -> list[str]:
    """A B B A A B ...: the arms' block order, `blocks` blocks each."""
    out = []
    for i in range(blocks):
        out += ["watched", "unwatched"] if i % 2 == 0 else ["unwatched", "watched"]
    return out


@torch.no_grad()
def weights_max_rel_diff(a, b) -> float:
    """The largest |a - b| / max |b| over the two models' parameters (float32)."""
    worst = 0.0
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        d = float((p.float() - q.float()).abs().max() / q.float().abs().max().clamp_min(1e-30))
        worst = max(worst, d)
    return worst


def traced_costs(out: Path) -> list[dict]:
    """Each traced step's cost as the run records it: {'step', 'calls', 'snapshot_ms', 'record_ms'}."""
    from instrumentation.recording import model_run_stream as stream

    rows = []
    for step, rank, name in stream.list_steps(out):
        doc = json.loads((out / stream.STEPS / name / stream.STEP_MANIFEST).read_text())
        rows.append({"step": step, "rank": rank, "calls": len(doc["calls"]), **doc.get("cost", {})})
    return rows


def run(args, argv) -> dict:
    from instrumentation.watch import watch

    device = pick_device("cpu" if args.tiny else args.device)
    size = dict(TINY if args.tiny else GPU)
    for key in ("steps", "block", "every", "warmup", "batch", "seq", "layers"):
        if getattr(args, key) is not None:
            size[key] = getattr(args, key)
    if size["steps"] % size["block"]:
        raise ValueError(f"--steps {size['steps']} is not a whole number of --block {size['block']} blocks")
    if size["block"] % size["every"]:
        log(f"note: --block {size['block']} is not a multiple of --every {size['every']}: the watched blocks "
            "hold different numbers of traced steps")
    dtype = torch.float32 if args.tiny else torch.bfloat16
    shape = dict(TINY_CONFIG if args.tiny else LLAMA3_8B)
    if args.vocab is not None:
        shape["vocab_size"] = args.vocab
    g = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    pool = [torch.randint(0, shape["vocab_size"], (size["batch"], size["seq"]), generator=g).to(device)
            for _ in range(size["pool"])]
    arms = {name: Arm(name, build(shape, size["layers"], size["intermediate"], device, dtype, args.seed), pool, device)
            for name in ("watched", "unwatched")}
    run_dir = Path(args.run_dir) if args.run_dir else Path(tempfile.mkdtemp(prefix="tilescope-watch-overhead-")) / "run"
    w = watch(arms["watched"].model, run_dir, every=size["every"], heads=[0], backward=True, decode=args.decode)
    arms["watched"].watch = w
    meta = run_meta(device, "watch_overhead", argv, prog="python -m benchmarks.watch_overhead")
    meta.update(model=dict(shape, layers=size["layers"], intermediate=size["intermediate"],
                           dtype="fp32" if args.tiny else "bf16", attention="tilescope", optimizer="AdamW"),
                shape=dict(batch=size["batch"], seq=size["seq"]),
                watch=dict(every=size["every"], heads=[0], backward=True, level="full", decode=args.decode),
                timing=dict(steps=size["steps"], block=size["block"], warmup=size["warmup"],
                            order="A B B A (watched first), blocks timed synchronised, the watched block's "
                                  "end after w.flush()"),
                goal=f"watched / unwatched mean step time <= {GOAL}")
    suffix = ("-tiny" if args.tiny else "") + ("-thread" if args.decode == "thread" else "")
    path = Path(args.out) / f"watch-overhead-{device_slug(meta['device'])}{suffix}.json" if args.out else None
    t_start = time.perf_counter()

    def write(final: bool) -> dict:
        """The result so far (each block pair: a run stopped by a time limit leaves its blocks)."""
        doc = {"meta": meta, "complete": final, **summarise(arms, size, run_dir, device, final),
               "decoder": decoder(w), "seconds": time.perf_counter() - t_start}
        doc["meets_goal"] = doc["meets_goal"] and not doc["decoder"]["skipped_steps"]
        if path is not None:
            files.write_json_atomic(path, files.json_safe(doc))
        return doc

    try:
        for arm in arms.values():
            for _ in range(size["warmup"]):
                arm.step(timed=False)
            arm.sync()
        log(f"warm-up done ({time.perf_counter() - t_start:.1f} s): {size['warmup']} steps each")
        for i, name in enumerate(order(size["steps"] // size["block"])):
            arms[name].block(size["block"])
            log(f"block {i}: {name:9s} {arms[name].block_s[-1] / size['block'] * 1e3:8.2f} ms/step "
                f"({time.perf_counter() - t_start:.0f} s)")
            if i % 2 == 1 and i + 1 < 2 * (size["steps"] // size["block"]):
                write(final=False)
    finally:
        w.close()
    doc = write(final=True)
    if path is not None:
        log(f"wrote {path}")
    if not args.run_dir:
        shutil.rmtree(run_dir.parent, ignore_errors=True)
    return doc


def decoder(w) -> dict:
    """Where the watched run's steps were decoded and saved: {'mode': 'process' or 'thread',
    'in_child': a child process did it, 'pid', 'torch_loaded' (never, there; else 'torch_import' says
    where it was imported first: file:line frames, innermost first), 'skipped_steps'
    (traced steps not traced because the ones before were still being written), 'errors'}."""
    info = dict(w.decoder_info)
    return {"mode": w.decode, "in_child": w.decode == "process" and "pid" in info, "pid": info.get("pid"),
            "torch_loaded": info.get("torch_loaded"), "torch_import": info.get("torch_import"),
            "skipped_steps": list(w.skipped), "errors": list(w.errors)}


def summarise(arms: dict, size: dict, run_dir: Path, device, final: bool = True) -> dict:
    """The numbers of the result file (see the module doc); the two copies' weights and losses
    are compared only at the end (final), when both have taken every step."""
    out: dict = {}
    for name, arm in arms.items():
        per_step = [s.elapsed_time(e) for s, e in arm.events] if device.type == "cuda" else []
        out[name] = {"block_ms_per_step": [b / size["block"] * 1e3 for b in arm.block_s],
                     "mean_step_ms": sum(arm.block_s) / (len(arm.block_s) * size["block"]) * 1e3,
                     "step_ms_median": statistics.median(per_step) if per_step else None,
                     "step_ms_max": max(per_step) if per_step else None,
                     "losses": [float(x) for x in arm.losses]}
    w, u = out["watched"]["mean_step_ms"], out["unwatched"]["mean_step_ms"]
    costs = traced_costs(run_dir)
    out["ratio"] = w / u
    out["meets_goal"] = out["ratio"] <= GOAL
    out["traced_steps"] = costs
    out["traced_steps_in_timed_blocks"] = sum(1 for c in costs if c["step"] >= size["warmup"])
    if not final:
        return out
    out["weights_max_rel_diff"] = weights_max_rel_diff(arms["watched"].model, arms["unwatched"].model)
    out["losses_equal"] = out["watched"]["losses"] == out["unwatched"]["losses"]
    log(f"mean step: watched {w:.2f} ms, unwatched {u:.2f} ms, ratio {out['ratio']:.4f} (goal <= {GOAL}: "
        f"{'met' if out['meets_goal'] else 'NOT met'}); {len(costs)} traced steps; weights max rel diff "
        f"{out['weights_max_rel_diff']:.2e}")
    return out


def main(argv=None) -> int:
    from instrumentation.cli.args import OneLineParser, bounded_int, run_guarded

    argv = sys.argv[1:] if argv is None else list(argv)
    ap = OneLineParser(prog="python -m benchmarks.watch_overhead", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a tiny Llama in the interpreter (the code path, seconds)")
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--steps", type=bounded_int(1, 100_000), default=None, help="timed steps per copy (GPU: 200)")
    ap.add_argument("--block", type=bounded_int(1, 100_000), default=None, help="steps per timed block (GPU: 100)")
    ap.add_argument("--every", type=bounded_int(1, 100_000), default=None, help="trace every k-th step (GPU: 100)")
    ap.add_argument("--warmup", type=bounded_int(1, 10_000), default=None, help="untimed steps per copy (GPU: 10)")
    ap.add_argument("--batch", type=bounded_int(1, 1024), default=None, help="GPU: 4")
    ap.add_argument("--seq", type=bounded_int(1, 131072), default=None, help="tokens per sequence (GPU: 4096)")
    ap.add_argument("--layers", type=bounded_int(1, 64), default=None, help="GPU: 4")
    ap.add_argument("--vocab", type=bounded_int(2, 1_000_000), default=None,
                    help="vocabulary (default Llama-3's 128256: its logits are most of a step's time)")
    ap.add_argument("--seed", type=bounded_int(0, 2**31 - 1), default=0)
    ap.add_argument("--decode", default="process", choices=["process", "thread"],
                    help="where the watch decodes and saves: its child process (default) or a thread of this one")
    ap.add_argument("--run-dir", default=None, help="keep the watched run here (default: a temporary directory)")
    ap.add_argument("--out", default=DEFAULT_OUT, help="result directory ('' writes none)")
    args = ap.parse_args(argv)
    return run_guarded(lambda: (run(args, argv), 0)[1])


if __name__ == "__main__":
    sys.exit(main())
