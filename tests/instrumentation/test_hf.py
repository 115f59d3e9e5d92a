"""instrumentation.hf: a transformers model's attention through Tilescope's kernels.

Tiny models from configs with random weights (no download), fp32: our attention against
transformers' eager attention (logits, greedy tokens), sliding-window layers, the captured traces,
and the one-line refusals of what the kernel cannot express.
"""

import pytest
import torch

from instrumentation import hf  # noqa: E402
from kernels import naive_attention  # noqa: E402


@pytest.fixture(autouse=True)
def _needs_transformers():
    """Skip without transformers; imported by the tests that run, not at collection (every test
    worker collects this module: importing transformers there cost each one ~0.7 s of CPU)."""
    pytest.importorskip("transformers")


TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
            attn_implementation="eager")


def tiny_model(cls_name: str, device="cpu", seed: int = 0, **config):
    import transformers

    config_cls = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))
    torch.manual_seed(seed)
    return getattr(transformers, cls_name)(config_cls(**{**TINY, **config})).eval().to(device)


def prompt(n: int, batch: int = 1, device="cpu"):
    return torch.randint(0, TINY["vocab_size"], (batch, n), generator=torch.Generator().manual_seed(1)).to(device)


def agree_with_eager(model, ids):
    with torch.no_grad():
        ref, ref_tokens = model(ids).logits, model.generate(ids, max_new_tokens=8, do_sample=False)
        hf.use_tilescope(model)
        assert model.config._attn_implementation == hf.NAME
        out, tokens = model(ids).logits, model.generate(ids, max_new_tokens=8, do_sample=False)
    assert (out - ref).abs().max().item() < 1e-4
    assert tokens[0, -8:].tolist() == ref_tokens[0, -8:].tolist()


def test_llama_gqa_matches_eager_logits_and_greedy_tokens(device):
    agree_with_eager(tiny_model("LlamaForCausalLM", device), prompt(40, device=device))


@pytest.mark.parametrize("cls_name, config", [
    ("MistralForCausalLM", dict(sliding_window=8)),                 # every layer sliding
    ("Qwen2ForCausalLM", dict(sliding_window=8, use_sliding_window=True,
                              layer_types=["full_attention", "sliding_attention"])),
])
def test_sliding_window_layers_match_eager(cls_name, config, device):
    agree_with_eager(tiny_model(cls_name, device, **config), prompt(24, device=device))   # the prompt is 3 windows long


def test_capture_one_trace_per_attention_call_with_the_kernels_shapes(device):
    model = tiny_model("Qwen2ForCausalLM", device, sliding_window=8, use_sliding_window=True,
                       layer_types=["full_attention", "sliding_attention"])
    ids = prompt(20, device=device)
    with hf.capture(model) as run:
        tokens = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert model.config._attn_implementation == "eager"        # restored after the block
    # 3 forward passes (prefill + 2 decode steps: the 3rd token needs no forward) x 2 layers
    assert [(c.step, c.layer, c.phase) for c in run.calls] == [
        (0, 0, "prefill"), (0, 1, "prefill"), (1, 0, "decode"), (1, 1, "decode"), (2, 0, "decode"), (2, 1, "decode")]
    for c in run.calls:
        shape = c.trace.meta["shape"]
        assert (shape["N_q"], shape["N_k"], shape["H_kv"], shape["H"]) == (c.n_q, c.n_k, 2, 4) == \
            (c.n_q, c.n_k, c.kv_heads, c.heads)
        assert c.trace.meta["model_call"] == {"step": c.step, "layer": c.layer, "phase": c.phase,
                                              "model": "Qwen2ForCausalLM"}
        assert c.trace.meta["inputs"] == hf.CAPTURED_INPUTS       # the pages never regenerate them
        assert c.kv_cache_bytes == 2 * c.batch * c.kv_heads * c.n_k * c.head_dim * 4
    full, sliding = run.calls[0::2], run.calls[1::2]
    assert [(c.n_q, c.n_k, c.mask, c.window) for c in full] == \
        [(20, 20, "causal", None), (1, 21, "causal", None), (1, 22, "causal", None)]
    # the sliding layer: a window mask in prefill; its decode steps read only the last W keys
    assert [(c.n_q, c.n_k, c.mask, c.window) for c in sliding] == \
        [(20, 20, "sliding_window:8", 8), (1, 8, "causal", 8), (1, 8, "causal", 8)]
    assert run.calls[2].trace.meta.get("kind") == "decode" and "splits" in run.calls[2].trace.tables
    with torch.no_grad():
        assert torch.equal(tokens, model.generate(ids, max_new_tokens=3, do_sample=False))
    assert run.meta["config"]["num_key_value_heads"] == 2 and run.steps() == 3 and run.layers() == [0, 1]


def test_capture_selected_layers_and_heads(device):
    model = tiny_model("LlamaForCausalLM", device)
    with hf.capture(model, layers=[1], heads=[0, 3], measure=False) as run:
        model(prompt(20, device=device))
    assert [(c.layer, c.phase) for c in run.calls] == [(1, "prefill")]
    trace = run.calls[0].trace
    assert trace.meta["level"] == "full" and trace.meta["traced_heads"] == [0, 3]
    assert set(trace.tiles["bh"]) == {0, 3} and len(trace.rows) > 0
    with pytest.raises(ValueError, match="already running"), hf.capture(model), hf.capture(model):
        pass


def one_line_refusal(fn, match):
    with pytest.raises(ValueError, match=match) as info:
        fn()
    assert "\n" not in str(info.value)


def test_refusals_are_one_line(device):
    model = tiny_model("LlamaForCausalLM", device)
    hf.use_tilescope(model)
    ids = prompt(10, batch=2, device=device)
    padded = torch.ones(2, 10, dtype=torch.long, device=device)
    padded[1, :3] = 0                                                   # left padding
    with torch.no_grad():
        one_line_refusal(lambda: model(ids, attention_mask=padded), "takes no padding")
        one_line_refusal(lambda: model.generate(ids, attention_mask=padded, max_new_tokens=2), "takes no padding")
        # an unpadded batch (all ones) runs
        assert model(ids, attention_mask=torch.ones_like(padded)).logits.shape == (2, 10, 128)
    with hf.capture(model), torch.enable_grad():
        one_line_refusal(lambda: model(ids), "forward-only")            # gradients on, traced
    model.train()
    model.config.attention_dropout = 0.1
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    with torch.no_grad():
        one_line_refusal(lambda: model(ids), "dropout")
    gemma = tiny_model("Gemma2ForCausalLM", attn_logit_softcapping=50.0)
    one_line_refusal(lambda: hf.use_tilescope(gemma), "soft-capping")


class Layer(torch.nn.Module):
    layer_idx, is_causal = 3, True


def qkv(n_q, n_k, device, heads=4, kv_heads=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(t.to(device) for t in (torch.randn(1, heads, n_q, d, generator=g),
                                        torch.randn(1, kv_heads, n_k, d, generator=g),
                                        torch.randn(1, kv_heads, n_k, d, generator=g)))


def reference(q, k, v, seen, scale):
    """Dense softmax attention over the visible keys (GQA by repeating K/V): (B, N_q, H, D)."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~seen, float("-inf"))
    return (s.softmax(-1) @ v).transpose(1, 2)


def test_calls_against_a_dense_reference(device):
    # a sliding layer's decode step over a cache longer than its window reads only the last W keys
    q, k, v = qkv(1, 20, device)
    plan = hf.plan_call(Layer(), q, k, v, None, sliding_window=8)
    assert (plan["phase"], plan["k_start"], plan["k_end"], plan["mask"]) == ("decode", 12, 20, "causal")
    out, weights = hf.attention_forward(Layer(), q, k, v, None, scaling=0.3, sliding_window=8)
    seen = hf.kernel_pattern(1, 20, True, 8, device)
    assert weights is None and (out - reference(q, k, v, seen, 0.3)).abs().max() < 1e-5
    # a static cache: trailing empty slots the mask hides are cut; the rest is bottom-right causal
    q, k, v = qkv(4, 24, device)
    mask = torch.zeros(1, 1, 4, 24, dtype=torch.bool, device=device)
    mask[..., :16] = hf.kernel_pattern(4, 16, True, None, device)
    plan = hf.plan_call(Layer(), q, k, v, mask)
    assert (plan["phase"], plan["k_end"], plan["mask"]) == ("decode", 16, "causal")
    out, _ = hf.attention_forward(Layer(), q, k, v, mask, scaling=0.25)
    assert (out - reference(q, k, v, mask[0, 0], 0.25)).abs().max() < 1e-5
    # a chunk of 20 queries over 30 keys with a float (0 / min) mask: prefill, bottom-right
    q, k, v = qkv(20, 30, device)
    seen = hf.kernel_pattern(20, 30, True, 6, device)
    fmask = torch.zeros(1, 1, 20, 30, device=device).masked_fill(~seen, torch.finfo(torch.float32).min)
    plan = hf.plan_call(Layer(), q, k, v, fmask, sliding_window=6)
    assert (plan["phase"], plan["mask"]) == ("prefill", "sliding_window:6")
    out, _ = hf.attention_forward(Layer(), q, k, v, fmask, scaling=0.25, sliding_window=6)
    assert (out - reference(q, k, v, seen, 0.25)).abs().max() < 1e-5


def test_call_refusals(device):
    q, k, v = qkv(8, 8, device)
    causal = hf.kernel_pattern(8, 8, True, None, device)[None, None]
    one_line_refusal(lambda: hf.attention_forward(Layer(), q, k, v, None, softcap=30.0), "soft-capping")
    one_line_refusal(lambda: hf.attention_forward(Layer(), q, k, v, None, dropout=0.1), "dropout")
    one_line_refusal(lambda: hf.attention_forward(Layer(), q, k, v, None, position_bias=torch.zeros(1, device=device)),
                     "ALiBi")
    one_line_refusal(lambda: hf.attention_forward(Layer(), q, k, v, causal.float() - 1.0), "biases")
    bidirectional = torch.ones_like(causal)                              # more than causal shows
    one_line_refusal(lambda: hf.attention_forward(Layer(), q, k, v, bidirectional), "not the causal pattern")
    one_line_refusal(lambda: hf.attention_forward(Layer(), q, k, v, causal[..., :4]), "shape")
    one_line_refusal(lambda: hf.attention_forward(Layer(), q, k, v, causal.expand(3, 1, 8, 8)), "shape")
    one_line_refusal(lambda: hf.attention_forward(Layer(), q, k, v, torch.zeros_like(causal)), "hides every key")
    q4, k9, v9 = qkv(4, 9, device)
    one_line_refusal(lambda: hf.attention_forward(Layer(), q4, k9, v9, None), "positions are unknown")
    # and what it does run agrees with the naive kernel (mask None, N_q = N_k: causal)
    out, _ = hf.attention_forward(Layer(), q, k, v, None)
    naive = naive_attention(q, k, v, mask="causal")                      # GQA: H_kv = 2
    assert (out - naive.transpose(1, 2)).abs().max() < 1e-5


def test_mask_checked_in_row_chunks(device, monkeypatch):
    from instrumentation import hf_mask

    monkeypatch.setattr(hf_mask, "MASK_CHECK_ELEMENTS", 40)          # chunks of 2 rows of 20 keys
    q, k, v = qkv(12, 20, device)
    mask = hf.kernel_pattern(12, 20, True, 5, device)[None, None].expand(1, 4, 12, 20)   # per head
    assert hf.plan_call(Layer(), q, k, v, mask, sliding_window=5)["k_end"] == 20
    wrong = mask.clone()
    wrong[0, 3, 11, 10] = True                                           # the last chunk, 4th head
    one_line_refusal(lambda: hf.plan_call(Layer(), q, k, v, wrong, sliding_window=5), "sliding-window causal")


def test_instrumentation_hf_is_the_module():
    import instrumentation

    delattr(instrumentation, "hf")            # as before the first import: the package's __getattr__
    try:
        assert instrumentation.hf is hf and callable(instrumentation.hf.use_tilescope)
    finally:
        instrumentation.hf = hf


@pytest.mark.gpu
def test_llama3_8b_shaped_top1_agreement_with_sdpa_is_at_least_eagers():
    # bf16 rounding makes any two attention implementations disagree on some near-tied tokens of
    # a random-weight model; ours must disagree with SDPA no more often than transformers' eager does
    from benchmarks.hf_llama import build_model, prompt, top1_agreement

    model = build_model(layers=4, intermediate=1024, device="cuda")
    agreement = top1_agreement(model, prompt(1024, model.config.vocab_size, "cuda"))
    assert agreement["tilescope"] >= agreement["eager"] > 0.5, agreement


def test_prefill_trains_through_the_kernel_like_eager(device):
    """Gradients of every weight through our attention match eager attention's (float32)."""
    grads = {}
    for impl in ("eager", "tilescope"):
        model = tiny_model("LlamaForCausalLM", device)
        if impl == "tilescope":
            hf.use_tilescope(model)
        ids = prompt(12, batch=2, device=device)
        loss = model(ids, labels=ids).loss
        loss.backward()
        grads[impl] = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads["eager"].keys() == grads["tilescope"].keys() and grads["eager"]
    for name, g in grads["eager"].items():
        err = (grads["tilescope"][name] - g).abs().max().item()
        assert err <= 1e-4 * max(1.0, g.abs().max().item()), (name, err)


def compile_whole(fn):
    """`fn` under torch.compile with fullgraph=True (any graph break raises, with its reason) and
    the "aot_eager" backend, and the list its traced FX graphs are appended to: one dynamo trace
    gives the graph-break check, the graphs' nodes and the compiled result.

    Arguments: fn, the callable to compile.
    Returns: (compiled fn, graphs), graphs filled as the compiled fn is first called."""
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, inputs)

    return torch.compile(fn, backend=backend, fullgraph=True), graphs


def graph_targets(graphs) -> set:
    """The call targets (as text) of every node of the traced graphs."""
    return {str(node.target) for g in graphs for node in g.graph.nodes}


def test_compiled_llama_forward_has_no_graph_break_from_attention():
    # the unmasked case: a plain forward (no padding, no cache) passes no mask,
    # and the attention is one tilescope::flash_attention node (masks, caches and packed batches:
    # tests/instrumentation/test_hf_compile.py); fullgraph: a graph break anywhere raises
    model, ids = tiny_model("LlamaForCausalLM", num_hidden_layers=1), prompt(24)
    with torch.no_grad():
        hf.use_tilescope(model)
        want = model(ids).logits
        fn, graphs = compile_whole(lambda ids: model(ids).logits)
        got = fn(ids)
    assert len(graphs) == 1
    assert any("tilescope.flash_attention" in t for t in graph_targets(graphs))
    assert (got - want).abs().max().item() < 1e-5
