"""instrumentation.hf under torch.compile: masks, caches and packed batches read
nothing on the host, so a use_tilescope model compiles without graph breaks.

Tiny random-weight models (tests/instrumentation/test_hf.py), float32 on the CPU, backend
"aot_eager"; compiled results against eager ones (our eager path checks the mask entry by entry).
Each compiled function is traced once, with fullgraph=True (test_hf.compile_whole): a graph
break anywhere raises with its reason, and the traced graphs show which of our ops ran.
"""

import pytest
import torch

from instrumentation import hf, hf_compiled  # noqa: E402
from tests.instrumentation.test_hf import compile_whole, graph_targets, prompt, tiny_model  # noqa: E402


@pytest.fixture(autouse=True)
def _needs_transformers():
    """Skip without transformers; imported by the tests that run, not at collection (every test
    worker collects this module: importing transformers there cost each one ~0.7 s of CPU)."""
    pytest.importorskip("transformers")


def test_compiled_forward_with_a_mask_has_no_graph_break_and_equals_eager():
    model, ids = hf.use_tilescope(tiny_model("LlamaForCausalLM", num_hidden_layers=1)), prompt(12, batch=2)
    ones = torch.ones_like(ids)                        # compiled, transformers materialises a 4-D mask
    fn = lambda ids, am: model(ids, attention_mask=am).logits  # noqa: E731
    with torch.no_grad():
        want = fn(ids, ones)
        compiled, graphs = compile_whole(fn)
        got = compiled(ids, ones)
        padded = ones.clone()
        padded[1, :3] = 0                              # eager refuses it; compiled: NaN, never silent
        nan = compiled(ids, padded)
    assert any("tilescope.flash_attention" in t for t in graph_targets(graphs))
    assert (got - want).abs().max().item() < 1e-5
    assert nan.isnan().all()


def test_compiled_training_step_equals_eager():
    ids = prompt(12, batch=2)
    ones = torch.ones_like(ids)
    result = {}
    for mode in ("eager", "compiled"):
        model = hf.use_tilescope(tiny_model("LlamaForCausalLM", num_hidden_layers=1)).train()
        step = lambda ids, am: model(ids, attention_mask=am, labels=ids).loss  # noqa: E731
        if mode == "compiled":
            step = torch.compile(step, backend="aot_eager")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        loss = step(ids, ones)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()                                     # eager AdamW, then a second compiled loss
        result[mode] = (loss.item(), grads, step(ids, ones).item())
    (loss_e, grads_e, after_e), (loss_c, grads_c, after_c) = result["eager"], result["compiled"]
    assert abs(loss_e - loss_c) <= 1e-5 and abs(after_e - after_c) <= 1e-5 and after_c < loss_c
    assert grads_e.keys() == grads_c.keys()
    for name, g in grads_e.items():
        assert (grads_c[name] - g).abs().max().item() <= 1e-5 * max(1.0, g.abs().max().item()), name


def test_padding_free_batch_eager_and_compiled_equals_separate_sequences():
    # DataCollatorWithFlattening(return_flash_attn_kwargs=True)'s layout: batch 1, positions
    # restarting per sequence, cu_seq_lens on the device, max_length host ints
    model, ids = hf.use_tilescope(tiny_model("LlamaForCausalLM", num_hidden_layers=1)), prompt(12)
    pos = torch.tensor([[*range(7), *range(5)]])
    cu = torch.tensor([0, 7, 12], dtype=torch.int32)
    fn = lambda ids, pos, cu: model(ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu,  # noqa: E731
                                    max_length_q=7, max_length_k=7, use_cache=False).logits
    with torch.no_grad():
        want = torch.cat([model(ids[:, :7]).logits, model(ids[:, 7:]).logits], 1)
        eager = fn(ids, pos, cu)
        compiled, graphs = compile_whole(fn)
        got = compiled(ids, pos, cu)
        with pytest.raises(ValueError, match="packed sequences' pattern"):
            fn(ids, pos, torch.tensor([0, 6, 12], dtype=torch.int32))   # cu_seq_lens against the mask
    assert any("flash_attention_varlen" in t for t in graph_targets(graphs))
    assert (eager - want).abs().max().item() < 1e-5 and (got - want).abs().max().item() < 1e-5


def test_static_cache_generate_with_a_compiled_forward_runs_our_ops_and_sdpas_tokens():
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, inputs)

    model, ids = tiny_model("LlamaForCausalLM", num_hidden_layers=1), prompt(20)
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        want = model.generate(ids, max_new_tokens=3, do_sample=False, cache_implementation="static")
        hf.use_tilescope(model)
        model.forward = torch.compile(model.forward, backend=backend, fullgraph=True)
        got = model.generate(ids, max_new_tokens=3, do_sample=False, cache_implementation="static")
    ops = [{str(n.target) for n in g.graph.nodes if "tilescope" in str(n.target)} for g in graphs]
    # the prefill (20 queries over the static cache's 23 slots): varlen over keys [0, 20) on the
    # device; each decode step: flash_decode with cache_seqlens from the mask
    assert ops == [{"tilescope.flash_attention_varlen.default"}, {"tilescope.flash_decode"}], ops
    assert got.tolist() == want.tolist()


def test_mask_edges_key_range_and_check_on_the_device():
    causal = hf.kernel_pattern(3, 10, True, None, "cpu")                # 3 queries over keys [0, 10)
    cache = torch.zeros(2, 1, 3, 16, dtype=torch.bool)                 # a static cache of 16 slots
    cache[0, 0, :, :10] = causal
    cache[1, 0, :, :5] = hf.kernel_pattern(3, 5, True, None, "cpu")
    end, ok = hf_compiled.mask_edges(cache, 2, 3, True, None)
    assert end.tolist() == [10, 5] and bool(ok)
    left_padded = cache.clone()
    left_padded[1, 0, :, 0] = False
    assert not bool(hf_compiled.mask_edges(left_padded, 2, 3, True, None)[1])
    window = hf.kernel_pattern(3, 10, True, 4, "cpu")[None, None]
    assert bool(hf_compiled.mask_edges(window, 1, 3, True, 4)[1])
    assert not bool(hf_compiled.mask_edges(window, 1, 3, True, None)[1])   # not plain causal
    biased = torch.zeros(1, 1, 3, 10).masked_fill(~causal, float("-inf"))
    assert bool(hf_compiled.mask_edges(biased, 1, 3, True, None)[1])
    assert not bool(hf_compiled.mask_edges(biased - 0.5, 1, 3, True, None)[1])   # a score bias


@pytest.mark.gpu
def test_inductor_compiled_llama_bf16_and_static_cache_generate_on_cuda():
    from transformers.generation.configuration_utils import CompileConfig

    model, ids = tiny_model("LlamaForCausalLM", "cuda"), prompt(64, batch=2, device="cuda")
    model = model.to(torch.bfloat16)
    ones = torch.ones_like(ids)
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        want = model(ids, attention_mask=ones).logits.float()
        tokens = model.generate(ids[:1], max_new_tokens=8, do_sample=False, cache_implementation="static")
        hf.use_tilescope(model)
        fn = torch.compile(lambda ids, am: model(ids, attention_mask=am).logits, fullgraph=True)
        got = fn(ids, ones).float()
        config = CompileConfig(fullgraph=True)         # transformers' default: inductor, reduce-overhead
        ours = model.generate(ids[:1], max_new_tokens=8, do_sample=False, cache_implementation="static",
                              compile_config=config)
    assert (got - want).abs().max().item() < 0.05 * want.abs().max().item()
    assert ours.tolist() == tokens.tolist()
