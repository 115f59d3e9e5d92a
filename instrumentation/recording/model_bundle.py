"""Recordings of real models' attention for data/: long prefills at each preset's shape, and
captured model runs of small transformers models shaped like real ones (random weights).
The command line is instrumentation.cli.regenerate (`--only presets`, `--only runs`).

    traces/preset-{model}_n{N}_{mask}_natural/   prefill at N = 8k, 32k and the model's longest
                                                practical N (LONG_PRESETS), B = 1, bf16, the
                                                preset's heads, KV heads, head dim and each
                                                layer kind's mask. Work timing for every head;
                                                tiles and softmax rows of heads spread over the
                                                launch (_detail: never the first wave's head
                                                alone), work items only past MAX_DETAIL_TILES
                                                tiles (a 128k causal grid is a million tiles).
    runs/{name}/                                a ModelRun (instrumentation.hf.capture) of a
                                                generate (MODEL_RUNS): a PROMPT-token prompt, then
                                                decode steps (DECODE_STEPS for Llama), tiles of
                                                head 0 in the prefill.

Resumable like the rest of regenerate: an output that exists and loads with the planned shape
is skipped. Running out of GPU memory is recorded as a problem, never fatal.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..trace import files
from ..trace.files import utc_now

# (preset, N values): 8k, 32k and the longest N worth a recording on one GPU. Llama-3-8B's
# attention shape is Llama-3.1-8B's, whose context is 128k; Qwen2.5-7B reads 128k with YaRN;
# Mistral-7B's sliding window keeps its cost linear in N. Gemma-2-9B's context is 8k (32k is
# recorded to compare with the others). N already bundled by data_bundle.PRESET_TRACES (Mistral
# and Gemma local at 8k) is left to it.
LONG_PRESETS = (("llama-3-8b", (8192, 32768, 131072)), ("mistral-7b", (32768, 131072)),
                ("qwen2.5-7b", (8192, 32768, 131072)), ("gemma-2-9b", (8192, 32768)))
TRACED_Q_BLOCKS = 2                # the middle and the last query block of a one-head detail
MAX_DETAIL_TILES = 1 << 16         # tile grid past which a trace keeps work items only
SPREAD_DETAIL_TILES = 1 << 14      # tile grid up to which three heads get detail (beyond it one)
PROMPT, DECODE_STEPS = 512, 16

# Llama-3-8B's attention and embeddings (config.json of meta-llama/Meta-Llama-3-8B; the context
# of Llama-3.1); the MLP is narrow: it costs memory and is the same whatever the attention.
LLAMA3_8B = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                 vocab_size=128256, rope_theta=500000.0, max_position_embeddings=131072, rms_norm_eps=1e-5)
# Qwen2.5-7B's attention (28 / 4 heads, D 128) with a sliding window on alternate layers, so one
# run holds local and global layers side by side (Qwen2's use_sliding_window / layer_types).
QWEN25_7B = dict(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                 rope_theta=1000000.0, max_position_embeddings=32768, rms_norm_eps=1e-6)
SLIDING_WINDOW = 256               # shorter than the prompt, so the window shows in a 512-token prefill
MODEL_RUNS = {
    "llama-3-8b-4l": dict(cls="LlamaForCausalLM", config=dict(LLAMA3_8B, num_hidden_layers=4),
                          steps=DECODE_STEPS, about="Llama-3-8B-shaped LlamaForCausalLM, 4 layers, random weights"),
    "qwen2.5-7b-4l-sliding": dict(
        cls="Qwen2ForCausalLM",
        config=dict(QWEN25_7B, num_hidden_layers=4, use_sliding_window=True, sliding_window=SLIDING_WINDOW,
                    max_window_layers=0, layer_types=["sliding_attention", "full_attention"] * 2),
        steps=2,                   # a few decode steps: each call's decode trace is ~0.13 MB
        about=f"Qwen2.5-7B-shaped Qwen2ForCausalLM, 4 layers, a {SLIDING_WINDOW}-token window on layers 0 "
              "and 2, random weights"),
}
MLP_WIDTH = 1024


def long_preset_jobs(cpu: bool = False) -> list[dict]:
    """The long-prefill recordings: one job per (preset, N, layer kind). cpu: a tiny version
    (few heads, N 64 and 128, windows scaled) for the interpreter tests."""
    from kernels.presets import preset

    jobs = []
    for name, ns in LONG_PRESETS:
        p = preset(name).scaled(max_heads=4) if cpu else preset(name)
        for n in ((64, 128) if cpu else ns):
            for mask in dict.fromkeys(p.masks):
                if cpu:
                    mask = mask.replace("4096", str(n // 4))
                elif (name, n) in (("mistral-7b", 8192), ("gemma-2-9b", 8192)) and mask.startswith("sliding"):
                    continue
                jobs.append(dict(preset=name, n=n, mask=mask, heads=p.heads, kv_heads=p.kv_heads,
                                 head_dim=p.head_dim))
    return jobs


def long_trace_name(job: dict) -> str:
    from .data_bundle import trace_name
    return trace_name(job["n"], job["mask"], "natural", job["preset"], job["n"])


def _detail(n: int, head_dim: int, dtype, n_bh: int) -> tuple[str, list[int], list[int]]:
    """(level, traced query blocks, tile-traced heads) of a long prefill of n_bh = B * H heads.

    The work table comes from a launch without tile tracing, but the pages compare the traced
    heads' items with the others of their query block: head 0 alone runs in the launch's first
    wave, whose items are slower whatever is traced (1.10-1.22x in the H200 recordings), so the
    heads are spread over the launch. Up to SPREAD_DETAIL_TILES tiles (8k): the first, middle and
    last head (data_bundle.detailed_heads, as the bundle's traces) on the last query block; up to
    MAX_DETAIL_TILES (32k): the middle head on the middle and last blocks (a 32k grid's tile table
    is ~0.9 MB per head: three would take data/ past its budget); past that work items only."""
    from kernels import default_config

    from .data_bundle import detailed_heads

    cfg = default_config(head_dim, dtype, n=n)
    n_qb, n_kb = -(-n // cfg.block_m), -(-n // cfg.block_n)
    if n_qb * n_kb > MAX_DETAIL_TILES:
        return "work", [], []
    if n_qb * n_kb > SPREAD_DETAIL_TILES:
        return "full", sorted({n_qb // 2, n_qb - 1})[:TRACED_Q_BLOCKS], [n_bh // 2]
    return "full", [n_qb - 1], detailed_heads(n_bh)


def _existing_long_ok(path: Path, job: dict) -> bool:
    from ..trace import Trace, TraceFormatError

    if not (path / "manifest.json").exists():
        return False
    try:
        m = Trace.load(path).meta
    except TraceFormatError:
        return False
    from ..analysis.traced_items import two_launch_recording
    from .environment import DTYPES

    s = m["shape"]
    level, _, heads = _detail(job["n"], job["head_dim"], DTYPES["bf16"], job["heads"])
    return two_launch_recording(m) and \
        (s["N"], s["N_k"], s["H"], s["H_kv"], s["D"], m["mask"], m.get("preset")) == \
        (job["n"], job["n"], job["heads"], job["kv_heads"], job["head_dim"], job["mask"], job["preset"]) and \
        (level != "full" or m.get("traced_heads") == heads)     # a head-0-only recording is made again


def record_long_presets(out: Path, device, command: str, deadline, failures: list, cpu: bool = False) -> bool:
    """Record each long-prefill job under out/traces/ unless it exists. Returns False when the
    deadline stopped it (rerun to resume)."""
    import torch

    from .environment import DTYPES
    from .flash import record
    from .inputs import make_inputs

    tdir = out / "traces"
    tdir.mkdir(parents=True, exist_ok=True)
    dtype = "bf16"
    for job in long_preset_jobs(cpu):
        name = long_trace_name(job)
        path = tdir / name
        if _existing_long_ok(path, job):
            continue
        if deadline is not None and time.monotonic() > deadline:
            return False
        level, blocks, heads = _detail(job["n"], job["head_dim"], DTYPES[dtype], job["heads"])
        print(f"presets: {name} ({level})", flush=True)
        try:
            q, k, v = make_inputs(1, job["heads"], job["n"], job["head_dim"], dtype, seed=0, device=device,
                                  kv_heads=job["kv_heads"])
            _, trace = record(q, k, v, mask=job["mask"], level=level, trace_head=heads or 0,
                              trace_q_blocks=blocks or "auto",
                              meta_extra={"command": command, "recipe": "instrumentation.regenerate --only presets",
                                          "preset": job["preset"], "input_seed": 0,
                                          "inputs": "instrumentation.make_inputs",
                                          "trace_q_blocks_request": (
                                              f"heads {heads}, query blocks {blocks}" if blocks else
                                              "work items only: the tile grid is over "
                                              f"{MAX_DETAIL_TILES:,} tiles")})
            del q, k, v
            tmp = tdir / (name + ".partial")
            trace.save(tmp, force=True)
            files.replace_dir(tmp, path)
        except torch.cuda.OutOfMemoryError as exc:
            failures.append({"file": f"traces/{name}", "kind": "trace", "when": utc_now(),
                             "error": "torch.cuda.OutOfMemoryError: " + str(exc).strip().splitlines()[0][:300]})
        except ValueError as exc:
            failures.append({"file": f"traces/{name}", "kind": "trace", "error": str(exc), "when": utc_now()})
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return True


# -- captured model runs ----------------------------------------------------------------------------

def build_model(name: str, device, cpu: bool = False, seed: int = 0):
    """MODEL_RUNS[name] as a transformers model with random weights (nothing is downloaded), in
    eval mode; bf16 on CUDA. cpu: a tiny version of the same architecture (4 heads, D 16, fp32)."""
    import torch
    import transformers

    spec = MODEL_RUNS[name]
    config = dict(spec["config"], intermediate_size=MLP_WIDTH, attn_implementation="sdpa")
    if cpu:
        config.update(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      vocab_size=128, intermediate_size=128)
        if config.get("sliding_window"):
            config["sliding_window"] = 8
    cls = getattr(transformers, spec["cls"])
    config_cls = getattr(transformers, spec["cls"].replace("ForCausalLM", "Config"))
    torch.manual_seed(seed)
    with torch.device(device):
        model = cls(config_cls(**config))
    return model.to(torch.float32 if cpu else torch.bfloat16).eval()


def record_model_runs(out: Path, device, command: str, deadline, failures: list, cpu: bool = False) -> bool:
    """Capture each MODEL_RUNS model generating DECODE_STEPS tokens after a PROMPT-token prompt
    into out/runs/NAME unless it exists. Returns False when the deadline stopped it."""
    import torch

    from .. import hf
    from ..analysis.traced_items import two_launch_recording
    from .model_run import ModelRun, ModelRunFormatError

    rdir = out / "runs"
    rdir.mkdir(parents=True, exist_ok=True)
    for name, spec in MODEL_RUNS.items():
        prompt_len, steps = (24, 3) if cpu else (PROMPT, spec["steps"])
        path = rdir / name
        try:
            done = ModelRun.load(path)
            # calls recorded before record() drew work from a launch of its own are recorded again
            if all(two_launch_recording(done.trace_meta(i)) for i in range(len(done))):
                continue
        except ModelRunFormatError:
            pass
        if deadline is not None and time.monotonic() > deadline:
            return False
        print(f"runs: {name}", flush=True)
        try:
            model = build_model(name, device, cpu)
            vocab = model.config.vocab_size
            ids = torch.randint(0, vocab, (1, prompt_len), generator=torch.Generator().manual_seed(1)).to(device)
            hf.use_tilescope(model)
            with torch.no_grad():      # compile every kernel first: no compile time in a recorded call
                model.generate(ids, max_new_tokens=2, do_sample=False)
            with hf.capture(model, heads=[0]) as run:
                tokens = model.generate(ids, max_new_tokens=steps + 1, do_sample=False)   # prefill + steps
            run.meta.update(command=command, recipe="instrumentation.regenerate --only runs", name=name,
                            about=spec["about"], prompt_tokens=prompt_len, decode_steps=steps,
                            generated=tokens[0, prompt_len:].tolist(), weights="random (torch.manual_seed(0))")
            run.save(path, force=True)
            del model, run
        except torch.cuda.OutOfMemoryError as exc:
            failures.append({"file": f"runs/{name}", "kind": "model run", "when": utc_now(),
                             "error": "torch.cuda.OutOfMemoryError: " + str(exc).strip().splitlines()[0][:300]})
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return True
