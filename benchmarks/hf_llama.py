"""A Llama-3-8B-shaped transformers model with Tilescope's attention against SDPA: top-1 agreement,
greedy tokens and the whole forward's time.

    python -m benchmarks.hf_llama                       # 4 layers, bf16, prompts 1024, 4096, 8192
    python -m benchmarks.hf_llama --seq-lens 2048 --agree-len 1024 --new-tokens 16
    python -m benchmarks.hf_llama --compile             # also torch.compile'd (Inductor) runs, < 5 min

The model is LlamaForCausalLM from a config with random weights (seeded; nothing is downloaded):
Llama-3-8B's attention and embeddings (hidden 4096, 32 heads, 8 KV heads, head dim 128, vocab
128256, rope theta 500000) with --layers layers and a small MLP (--intermediate; the MLP is the
same for every attention implementation and only costs memory). bf16 on CUDA.

Agreement: the share of prompt positions whose top-1 token is the same as SDPA's, for ours and
for transformers' eager attention (bf16 rounding alone makes eager differ from SDPA; ours is held
to at least eager's agreement by a gpu test). Greedy: --new-tokens tokens generated from a
512-token prompt with ours and with SDPA, and how many are the same. Time: do_bench median of
model(ids, logits_to_keep=1) (a prefill: no cache, the last position's logits, as generate asks)
per prompt length, ours and SDPA on the same model. Writes data/benchmarks/hf-llama-<device-slug>.json.

--compile adds a "compiled" section, each model compiled with Inductor:
forward: torch.compile(model(ids, logits_to_keep=1)) at --compile-seq-lens (2048, 8192), ours
with fullgraph=True (so no graph break at all), SDPA compiled the same way; do_bench medians, the
last position's logits against compiled SDPA's (and eager SDPA against compiled SDPA: the bf16
noise). train: a compiled forward + loss (labels = ids) and its backward at N 2048, loss and
every weight's gradient against compiled SDPA's (max relative error over weights; eager SDPA
against compiled SDPA as the noise), and the step's time. generate: transformers' static-cache
generate with its own compile (CompileConfig(fullgraph=True): Inductor, reduce-overhead) from a
512-token prompt, --new-tokens tokens, ours and SDPA, how many are the same, and the second
call's wall time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from . import DEFAULT_OUT, device_slug, log, parse_int_list, pick_device, run_meta, time_ms
from instrumentation.recording.model_bundle import LLAMA3_8B     # the one Llama-3-8B shape (data/runs too)
from instrumentation.trace import files


def build_model(layers: int = 4, intermediate: int = 1024, device="cuda", dtype=torch.bfloat16, seed: int = 0):
    """A LlamaForCausalLM shaped as Llama-3-8B (LLAMA3_8B), `layers` layers, random weights.

    Arguments: layers; intermediate, the MLP width; device, dtype; seed for the weights.
    Returns: the model in eval mode, its attention on 'sdpa'."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=layers, intermediate_size=intermediate, attn_implementation="sdpa",
                         **LLAMA3_8B)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def set_attention(model, name: str):
    """Switch the model's attention: 'tilescope', or a transformers implementation ('sdpa', 'eager')."""
    from instrumentation import hf

    if name == hf.NAME:
        hf.use_tilescope(model)
    else:
        model.set_attn_implementation(name)
    return model


@torch.no_grad()
def top1(model, ids, attention: str) -> torch.Tensor:
    """The argmax token at every position of ids under the given attention: (B, N)."""
    return set_attention(model, attention)(ids).logits.argmax(-1)


def top1_agreement(model, ids) -> dict:
    """Share of positions whose top-1 token equals SDPA's, for 'tilescope' and 'eager'."""
    ref = top1(model, ids, "sdpa")
    return {name: float((top1(model, ids, name) == ref).float().mean()) for name in ("tilescope", "eager")}


def prompt(n: int, vocab: int, device, seed: int = 1, batch: int = 1) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, vocab, (batch, n), generator=g).to(device)


def _max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over max |b| (float32)."""
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


def compiled_forward(model, device, seq_lens) -> list:
    """Compiled (Inductor) tilescope and SDPA forwards: time and last-position logits per length."""
    out = []
    for n in seq_lens:
        ids = prompt(n, model.config.vocab_size, device)
        rec = {"seq_len": n, "batch": 1}
        with torch.no_grad():
            eager_sdpa = set_attention(model, "sdpa")(ids, logits_to_keep=1).logits
            logits, times = {}, {}
            for name in ("sdpa", "tilescope"):
                torch._dynamo.reset()
                set_attention(model, name)
                fn = torch.compile(lambda ids: model(ids, logits_to_keep=1).logits, dynamic=False,
                                   fullgraph=name == "tilescope")
                logits[name] = fn(ids)
                times[name] = time_ms(lambda: fn(ids), device, warmup=25, rep=100)
        rec.update({"tilescope_ms": times["tilescope"], "sdpa_ms": times["sdpa"],
                    "ratio_to_sdpa": times["tilescope"] / times["sdpa"], "fullgraph": True,
                    "logits_max_rel_err": _max_rel(logits["tilescope"], logits["sdpa"]),
                    "noise_eager_sdpa_max_rel_err": _max_rel(eager_sdpa, logits["sdpa"]),
                    "top1_same": bool((logits["tilescope"].argmax(-1) == logits["sdpa"].argmax(-1)).all())})
        log(f"compiled N={n}: tilescope {rec['tilescope_ms']:.3f} ms, sdpa {rec['sdpa_ms']:.3f} ms "
            f"({rec['ratio_to_sdpa']:.3f}x), logits rel err {rec['logits_max_rel_err']:.2e} "
            f"(eager vs compiled sdpa {rec['noise_eager_sdpa_max_rel_err']:.2e})")
        out.append(rec)
        torch.cuda.empty_cache()
    return out


def compiled_train(model, device, n: int) -> dict:
    """A compiled forward + loss and its backward: loss, gradients and time, ours against SDPA's."""
    ids = prompt(n, model.config.vocab_size, device, seed=3)
    model.train()
    runs, times = {}, {}
    for name, compiled in (("sdpa_eager", False), ("sdpa", True), ("tilescope", True)):
        torch._dynamo.reset()
        set_attention(model, "sdpa" if name.startswith("sdpa") else name)
        fn = lambda ids: model(ids, labels=ids).loss  # noqa: E731
        fn = torch.compile(fn, dynamic=False) if compiled else fn
        model.zero_grad(set_to_none=True)
        loss = fn(ids)
        loss.backward()
        runs[name] = (float(loss), {k: p.grad.detach().clone() for k, p in model.named_parameters()})
        if compiled:
            times[name] = time_ms(lambda: fn(ids).backward(), device, warmup=10, rep=100)
        model.zero_grad(set_to_none=True)
    model.eval()

    def grad_err(a, b):
        return max(_max_rel(runs[a][1][k], runs[b][1][k]) for k in runs[b][1])

    rec = {"seq_len": n, "batch": 1, "loss_tilescope": runs["tilescope"][0], "loss_sdpa": runs["sdpa"][0],
           "loss_sdpa_eager": runs["sdpa_eager"][0], "grad_max_rel_err": grad_err("tilescope", "sdpa"),
           "noise_grad_eager_sdpa_max_rel_err": grad_err("sdpa_eager", "sdpa"),
           "step_ms_tilescope": times["tilescope"], "step_ms_sdpa": times["sdpa"]}
    log(f"compiled train N={n}: loss {rec['loss_tilescope']:.5f} vs sdpa {rec['loss_sdpa']:.5f}, grad rel err "
        f"{rec['grad_max_rel_err']:.2e} (eager vs compiled sdpa {rec['noise_grad_eager_sdpa_max_rel_err']:.2e}), "
        f"step {rec['step_ms_tilescope']:.2f} vs {rec['step_ms_sdpa']:.2f} ms")
    del runs
    torch.cuda.empty_cache()
    return rec


def compiled_generate(model, device, new_tokens: int) -> dict:
    """transformers' static-cache generate with its own compile (Inductor, reduce-overhead)."""
    import time

    from transformers.generation.configuration_utils import CompileConfig

    ids = prompt(512, model.config.vocab_size, device, seed=2)
    tokens, wall = {}, {}
    for name in ("sdpa", "tilescope"):
        torch._dynamo.reset()
        set_attention(model, name)
        if hasattr(model, "_compiled_call"):
            del model._compiled_call                   # a fresh compile for each attention
        kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                  cache_implementation="static", compile_config=CompileConfig(fullgraph=True))
        with torch.no_grad():
            model.generate(ids, **kw)                  # compiles, captures
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = model.generate(ids, **kw)
            torch.cuda.synchronize()
        wall[name] = (time.perf_counter() - t0) * 1e3
        tokens[name] = out[0, 512:].tolist()
    same = sum(a == b for a, b in zip(tokens["sdpa"], tokens["tilescope"]))
    log(f"compiled static-cache generate: {same}/{new_tokens} tokens the same as SDPA's, "
        f"{wall['tilescope']:.1f} vs {wall['sdpa']:.1f} ms")
    return {"prompt_len": 512, "new_tokens": new_tokens, "same_as_sdpa": same, "tilescope": tokens["tilescope"],
            "sdpa": tokens["sdpa"], "wall_ms_tilescope": wall["tilescope"], "wall_ms_sdpa": wall["sdpa"],
            "compile_config": "CompileConfig(fullgraph=True): inductor, reduce-overhead"}


def compiled_section(model, seq_lens, train_len: int, new_tokens: int, device) -> dict:
    """The --compile measurements; a part that fails records its error line instead of its numbers."""
    section = {"backend": "inductor", "torch_version": torch.__version__}
    for key, fn in (("forward", lambda: compiled_forward(model, device, seq_lens)),
                    ("train", lambda: compiled_train(model, device, train_len)),
                    ("generate", lambda: compiled_generate(model, device, new_tokens))):
        try:
            section[key] = fn()
        except Exception as exc:   # noqa: BLE001 - one line in the record, the other parts still run
            section[key] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
            log(f"compiled {key}: {section[key]['error']}")
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    return section


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.hf_llama", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=1024, help="MLP width (Llama-3-8B's is 14336)")
    p.add_argument("--seq-lens", default="1024,4096,8192", help="prompt lengths timed")
    p.add_argument("--agree-len", type=int, default=2048, help="prompt length of the top-1 agreement")
    p.add_argument("--new-tokens", type=int, default=32, help="greedy tokens compared (512-token prompt)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="also time and compare torch.compile'd runs")
    p.add_argument("--compile-seq-lens", default="2048,8192", help="prompt lengths of the compiled forward")
    p.add_argument("--train-len", type=int, default=2048, help="sequence length of the compiled training step")
    p.add_argument("--out", default=DEFAULT_OUT, help="directory for hf-llama-<device-slug>.json")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    device = pick_device("auto")
    if device.type != "cuda":
        raise SystemExit("error: this benchmark needs a CUDA GPU (an 8B-shaped model in the interpreter "
                         "would take hours); the interpreter tests cover correctness")
    import transformers

    seq_lens = parse_int_list(args.seq_lens)
    model = build_model(args.layers, args.intermediate, device, seed=args.seed)
    vocab = model.config.vocab_size
    agreement = top1_agreement(model, prompt(args.agree_len, vocab, device))
    log(f"top-1 agreement with SDPA at N={args.agree_len}: tilescope {agreement['tilescope']:.4f}, "
        f"eager {agreement['eager']:.4f}")
    greedy_ids = prompt(512, vocab, device, seed=2)
    tokens = {}
    for name in ("sdpa", "tilescope"):
        with torch.no_grad():
            out = set_attention(model, name).generate(greedy_ids, max_new_tokens=args.new_tokens, do_sample=False,
                                                      min_new_tokens=args.new_tokens)
        tokens[name] = out[0, 512:].tolist()
    same = sum(a == b for a, b in zip(tokens["sdpa"], tokens["tilescope"]))
    log(f"greedy: {same}/{args.new_tokens} tokens the same as SDPA's")
    records = []
    for n in seq_lens:
        ids = prompt(n, vocab, device)
        times = {}
        for name in ("sdpa", "tilescope", "sdpa"):          # SDPA before and after: drift shows
            model_fn = set_attention(model, name)
            with torch.no_grad():
                times.setdefault(name, []).append(
                    time_ms(lambda: model_fn(ids, logits_to_keep=1), device, warmup=25, rep=200))
        sdpa_ms = sorted(times["sdpa"])[0]
        rec = {"seq_len": n, "batch": 1, "tilescope_ms": times["tilescope"][0], "sdpa_ms": sdpa_ms,
               "sdpa_ms_runs": times["sdpa"], "ratio_to_sdpa": times["tilescope"][0] / sdpa_ms}
        records.append(rec)
        log(f"N={n}: tilescope {rec['tilescope_ms']:.3f} ms, sdpa {sdpa_ms:.3f} ms "
            f"({rec['ratio_to_sdpa']:.3f}x)")
        torch.cuda.empty_cache()
    meta = run_meta(device, "hf_llama", argv if argv is not None else sys.argv[1:],
                    prog="python -m benchmarks.hf_llama")
    meta["transformers_version"] = transformers.__version__
    result = {
        "meta": meta,
        "model": {"class": "LlamaForCausalLM", "layers": args.layers, "intermediate_size": args.intermediate,
                  "dtype": "bf16", "weights": f"random (seed {args.seed})", **LLAMA3_8B},
        "agreement": {"seq_len": args.agree_len, "vs": "sdpa", **agreement},
        "greedy": {"prompt_len": 512, "new_tokens": args.new_tokens, "same_as_sdpa": same,
                   "sdpa": tokens["sdpa"], "tilescope": tokens["tilescope"]},
        "timing": "do_bench median of model(ids, logits_to_keep=1) under no_grad (a prefill's whole forward, "
                  "no cache, the last position's logits, as generate asks); SDPA timed "
                  "before and after ours, the faster of its two runs is the baseline",
        "records": records,
    }
    if args.compile:
        result["compiled"] = compiled_section(model, parse_int_list(args.compile_seq_lens), args.train_len,
                                              args.new_tokens, device)
    path = files.write_json_atomic(Path(args.out) / f"hf-llama-{device_slug(meta['device'])}.json", result)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
