"""CUDA graphs over call shapes the process has not seen (gpu): torch.compile(mode="reduce-overhead")
makes the plans and counters inside its warm-up, whose allocations CUDA-graph trees route into the
graph's pool and then check (every live pool block must be an output; kernels.device_cache makes
them outside it), and plain torch.cuda.graph captures after one eager call. flash_attention
(causal), flash_decode (contiguous with split-KV counters, paged through a block table, lengths on
the device) and flash_attention_varlen, each run 3+ times on new values: equal to the eager call
and within tolerance of a float64 reference. The CPU side of the helper: test_device_cache.py."""

import gc

import pytest
import torch

import kernels.decode_launch as decode_launch
import kernels.device_cache as dc
from kernels import flash_attention, flash_attention_varlen, flash_decode, reference_attention, reference_decode
from kernels.launch import clear_caches
from kernels.paged import paginate
from kernels.plan import _PLANS as BLOCK_PLANS
from kernels.varlen import reference_varlen
from tests.kernels.attention_checks import TOL, cu_seqlens

pytestmark = pytest.mark.gpu
F16 = torch.float16
LENS_Q, LENS_K = [37, 0, 90], [37, 5, 131]          # varlen: an empty sequence, N_q < N_k


def _rel(out, ref) -> float:
    return ((out.double().cpu() - ref).norm() / ref.norm()).item()


def _forward_inputs(gen):
    """B 1, H 3 / H_kv 1, N_q 203 < N_k 331, D 48: a shape no other test uses."""
    q = torch.randn(1, 3, 203, 48, generator=gen, device="cuda", dtype=F16)
    k, v = (torch.randn(1, 1, 331, 48, generator=gen, device="cuda", dtype=F16) for _ in range(2))
    return q, k, v


def _decode_inputs(gen, seed: int, paged: bool):
    """B 3, H 6 / H_kv 2, one query, capacity 333, D 48; lengths on the device, new each seed."""
    q = torch.randn(3, 6, 1, 48, generator=gen, device="cuda", dtype=F16)
    k, v = (torch.randn(3, 2, 333, 48, generator=gen, device="cuda", dtype=F16) for _ in range(2))
    lens = torch.tensor([333, 100 + 7 * seed, 1 + seed % 3], dtype=torch.int32, device="cuda")
    if not paged:
        return (q, k, v, lens), (q, k, v, lens)
    kp, vp, table = paginate(k, v, 16, spare_pages=2, generator=torch.Generator().manual_seed(seed))
    return (q, kp, vp, lens, table), (q, k, v, lens)


def _varlen_inputs(gen, seed: int):
    """Packed H 4 / H_kv 2, D 40; the sequences in reverse order on odd seeds (same totals)."""
    lens_q, lens_k = (LENS_Q, LENS_K) if seed % 2 == 0 else (LENS_Q[::-1], LENS_K[::-1])
    q = torch.randn(sum(lens_q), 4, 40, generator=gen, device="cuda", dtype=F16)
    k, v = (torch.randn(sum(lens_k), 2, 40, generator=gen, device="cuda", dtype=F16) for _ in range(2))
    return q, k, v, cu_seqlens(lens_q, "cuda"), cu_seqlens(lens_k, "cuda")


def forward(q, k, v):
    return flash_attention(q, k, v, mask="causal")


def decode(q, k, v, lens):
    return flash_decode(q, k, v, cache_seqlens=lens, num_splits=4)          # split-KV: merge counters


def paged_decode(q, kp, vp, lens, table):
    return flash_decode(q, kp, vp, cache_seqlens=lens, block_table=table)


def varlen(q, k, v, cq, ck):
    return flash_attention_varlen(q, k, v, cq, ck, max(LENS_Q), max(LENS_K), mask="causal")


def _reference(name, args):
    if name == "forward":
        return reference_attention(*args, mask="causal")[0]
    if name in ("decode", "paged_decode"):
        return reference_decode(*args)[0]
    return reference_varlen(*args, mask="causal")[0]


CALLS = {"forward": (forward, lambda g, seed: _forward_inputs(g)),
         "decode": (decode, lambda g, seed: _decode_inputs(g, seed, False)),
         "paged_decode": (paged_decode, lambda g, seed: _decode_inputs(g, seed, True)),
         "varlen": (varlen, _varlen_inputs)}


def _inputs(name, seed):
    """(the call's arguments, the float64 reference's) for a seed."""
    made = CALLS[name][1](torch.Generator(device="cuda").manual_seed(seed), seed)
    return made if name in ("decode", "paged_decode") else (made, made)


@pytest.fixture
def fresh_caches(monkeypatch):
    """No plan or counter buffer from earlier tests: the compiled warm-up must make them. Counted:
    the entries the helper thread made."""
    clear_caches()
    BLOCK_PLANS.clear()
    decode_launch._RETIRED_GRAPH_COUNTERS.extend(decode_launch._COUNTERS.values())   # earlier graphs may replay
    decode_launch._COUNTERS.clear()
    made = []
    on_helper = dc._on_helper
    monkeypatch.setattr(dc, "_on_helper", lambda *args: made.append(args) or on_helper(*args))
    torch._dynamo.reset()
    return made


@pytest.mark.parametrize("names", [("forward", "varlen"), ("decode", "paged_decode")])
def test_reduce_overhead_warm_up_makes_new_plans_outside_the_graph_pool(names, fresh_caches):
    import torch._inductor.config as inductor_config

    for name in names:
        fn = CALLS[name][0]
        compiled = torch.compile(fn, mode="reduce-overhead", fullgraph=True)
        held = len(dc._HELD)
        with inductor_config.patch({"triton.slow_path_cudagraph_asserts": True}):    # the pool check
            for seed in range(4):                        # warm-up, record, replays
                args, ref_args = _inputs(name, seed)
                got = compiled(*args).clone()
                want = fn(*args)
                assert torch.equal(got, want), (name, seed)
                assert _rel(got, _reference(name, ref_args)) < TOL[F16], (name, seed)
            if name == "forward":
                # the plan the recorded graph reads is held: dropping the caches frees nothing it reads
                assert len(dc._HELD) > held
                clear_caches()
                BLOCK_PLANS.clear()
                gc.collect()
                args, ref_args = _inputs(name, 7)
                assert _rel(compiled(*args), _reference(name, ref_args)) < TOL[F16]
    assert fresh_caches, "the plans were made before the compiled calls"


def test_cuda_graph_capture_after_one_eager_call_replays_new_values():
    for name, (fn, _) in CALLS.items():
        static, _ = _inputs(name, 11)
        fn(*static)                                      # plans and counters made eagerly
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(*static)
        for seed in (12, 13, 14):
            args, ref_args = _inputs(name, seed)
            for dst, src in zip(static, args):
                dst.copy_(src)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, fn(*args)), (name, seed)
            assert _rel(out, _reference(name, ref_args)) < TOL[F16], (name, seed)
