"""flash_decode as the custom op tilescope::flash_decode: opcheck, torch.compile (no graph break,
fullgraph), no host read of cache_seqlens / block_table (validate=False), bad lengths and table
entries turned into NaN rows inside the kernel without reading outside the pool, the plan cache
keyed by shapes, and CUDA-graph capture of a paged step (gpu)."""

import pytest
import torch

from kernels import flash_decode, interpreting, reference_decode
from kernels.paged import paginate
from tests.kernels.attention_checks import check, decode_inputs as make


def _paged(device, seed=3, page=16, n=40):
    """B 3, H 4 / H_kv 2, D 16: contiguous caches, their pool (one spare page) and table."""
    (q, k, v), g = make(3, 4, 2, 1, n, 16, torch.float32, device, seed=seed)
    kp, vp, table = paginate(k, v, page, spare_pages=1, generator=g)
    lens = torch.tensor([n, 17, 1], dtype=torch.int32, device=device)
    return q, k, v, kp, vp, table, lens


def _op_args(q, k, v, lens, table, return_lse=True, splits=2):
    return (q, k, v, lens, table, 0.25, splits, 0, 0, 0, True, False, return_lse)


def test_opcheck_contiguous_and_paged(device):
    q, k, v, kp, vp, table, lens = _paged(device)
    op = torch.ops.tilescope.flash_decode.default
    torch.library.opcheck(op, _op_args(q, k, v, lens, None))
    torch.library.opcheck(op, _op_args(q, kp, vp, lens, table, return_lse=False, splits=1))


def test_compiled_paged_and_contiguous_have_no_graph_break_and_match_eager(device):
    q, k, v, kp, vp, table, lens = _paged(device)

    def step(q, kp, vp, lens, table, k, v):
        o, lse = flash_decode(q, kp, vp, lens, num_splits=2, return_lse=True, block_table=table)
        return o + flash_decode(q, k, v, lens), lse

    args = (q, kp, vp, lens, table, k, v)
    explain = torch._dynamo.explain(step)(*args)
    assert explain.graph_break_count == 0, explain.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(*args)
    for got, want in zip(compiled, step(*args)):
        assert torch.equal(got, want)


def test_grad_refused_in_one_line(device):
    q, k, v, kp, vp, table, lens = _paged(device)
    q.requires_grad_(True)
    for call in (lambda: flash_decode(q, k, v, lens),
                 lambda: torch.ops.tilescope.flash_decode(*_op_args(q, k, v, lens, None))):
        with pytest.raises(ValueError, match="forward-only") as err:
            call()
        assert "\n" not in str(err.value)


def test_plan_cache_is_keyed_by_shapes_not_lengths(device):
    from kernels.decode import _decode_plan

    q, k, v, kp, vp, table, lens = _paged(device)
    flash_decode(q, kp, vp, lens, block_table=table)
    misses = _decode_plan.cache_info().misses
    for new_lens, new_table in ((lens.flip(0), table), (lens.clamp(max=16), table.flip(0))):
        flash_decode(q, kp, vp, new_lens.contiguous(), block_table=new_table.contiguous())
    assert _decode_plan.cache_info().misses == misses


class _Loads:
    """Every address the interpreter loads from (monkeypatched into its builder)."""

    def __init__(self, monkeypatch):
        from triton.runtime import interpreter

        self.spans = []
        original = interpreter.InterpreterBuilder.create_masked_load

        def load(builder, ptrs, mask, other, cache_policy, is_volatile):
            self.spans.append(ptrs.data[mask.data].astype("int64"))
            return original(builder, ptrs, mask, other, cache_policy, is_volatile)

        monkeypatch.setattr(interpreter.InterpreterBuilder, "create_masked_load", load)

    def inside(self, t: torch.Tensor) -> int:
        lo, hi = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
        return sum(int(((s >= lo) & (s < hi)).sum()) for s in self.spans)


def _guarded(pool: torch.Tensor, sentinel=1e4):
    """pool copied between two guard pages of sentinel values (where entries -1 and num_blocks
    land): returns (the pool view, the two guards)."""
    store = torch.full((pool.shape[0] + 2, *pool.shape[1:]), sentinel, dtype=pool.dtype)
    store[1:-1] = pool
    return store[1:-1], (store[0], store[-1])


@pytest.mark.skipif(not interpreting(), reason="reads the interpreter's load addresses")
# pages of 1 key: the table read per key; of 16: once per page of a 32-key tile
@pytest.mark.parametrize("num_splits, page", [(1, 1), (3, 16)])
@pytest.mark.parametrize("bad", ["entry past the pool", "negative entry", "length past capacity"])
def test_bad_entries_and_lengths_give_nan_rows_and_never_read_outside(bad, num_splits, page, monkeypatch):
    q, k, v, kp, vp, table, lens = _paged("cpu", seed=num_splits, page=page)
    kp, k_guards = _guarded(kp)
    vp, v_guards = _guarded(vp)
    table, lens, b_bad = table.clone(), lens.clone(), 1
    if bad == "entry past the pool":
        table[b_bad, 1] = kp.shape[0]                 # the page after the pool: a guard
    elif bad == "negative entry":
        table[b_bad, 0] = -1                          # the page before it: the other guard
    else:
        lens[b_bad] = table.shape[1] * kp.shape[1] + 1
    loads = _Loads(monkeypatch)
    out, lse = flash_decode(q, kp, vp, lens, num_splits=num_splits, return_lse=True, block_table=table)
    assert all(loads.inside(g) == 0 for g in (*k_guards, *v_guards))
    assert loads.inside(kp) > 0                         # the addresses were seen
    assert torch.isnan(out[b_bad]).all() and torch.isnan(lse[b_bad]).all()
    good = [0, 2]
    ref_o, ref_lse = reference_decode(q[good], k[good], v[good], lens[good])
    check(out[good], lse[good], ref_o, ref_lse, torch.float32)
    with pytest.raises(ValueError, match="entries in use|0..N_max") as err:
        flash_decode(q, kp, vp, lens, num_splits=num_splits, block_table=table, validate=True)
    assert "\n" not in str(err.value)


@pytest.mark.skipif(not interpreting(), reason="reads the interpreter's load addresses")
def test_contiguous_length_past_capacity_is_nan_and_never_read(monkeypatch):
    (q, k, v), _ = make(2, 4, 2, 1, 32, 16, torch.float32, "cpu", seed=5)
    store = torch.full((3, 2, 32, 16), 1e4)            # sequence 2 is a guard: where 1's overrun lands
    store[:2] = k
    kc, guard = store[:2], store[2]
    lens = torch.tensor([20, 40], dtype=torch.int32)
    loads = _Loads(monkeypatch)
    out, lse = flash_decode(q, kc, v, lens, num_splits=2, return_lse=True)
    assert loads.inside(guard) == 0 and loads.inside(kc[1]) == 0        # sequence 1 reads no key
    assert torch.isnan(out[1]).all() and torch.isnan(lse[1]).all()
    check(out[:1], lse[:1], *reference_decode(q[:1], k[:1], v[:1], lens[:1]), torch.float32)


@pytest.mark.gpu
def test_inductor_fullgraph_paged_matches_eager(device):
    q, k, v, kp, vp, table, lens = _paged(device)
    step = lambda q, kp, vp, lens, table: flash_decode(q, kp, vp, lens, return_lse=True, block_table=table)  # noqa: E731
    got = torch.compile(step, fullgraph=True)(q, kp, vp, lens, table)
    for a, b in zip(got, step(q, kp, vp, lens, table)):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", ["auto", 4])
def test_paged_step_captured_in_a_cuda_graph_replays_new_contents(num_splits, device):
    """Captured once; each replay reads new cache values, lengths and a new table (the static
    buffers copied into), and equals the eager call on the same inputs."""
    (q, k, v), g = make(4, 32, 8, 1, 2048, 128, torch.bfloat16, device, seed=1)
    kp, vp, table = paginate(k, v, 64, spare_pages=4, generator=g)
    lens = torch.tensor([2048, 1, 700, 1500], dtype=torch.int32, device=device)
    call = lambda: flash_decode(q, kp, vp, lens, num_splits=num_splits, return_lse=True, block_table=table)  # noqa: E731
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()                                           # compile and make the counters first
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_static, lse_static = call()
    for seed in range(3):
        gen = torch.Generator(device=device).manual_seed(seed)
        q.copy_(torch.randn(q.shape, generator=gen, device=device, dtype=q.dtype))
        kp.copy_(torch.randn(kp.shape, generator=gen, device=device, dtype=kp.dtype))
        vp.copy_(torch.randn(vp.shape, generator=gen, device=device, dtype=vp.dtype))
        lens.copy_(torch.randint(1, 2049, lens.shape, generator=gen, device=device, dtype=torch.int32))
        table.copy_(torch.randperm(kp.shape[0], generator=gen, device=device)[:table.numel()].view_as(table))
        graph.replay()
        o_eager, lse_eager = call()
        assert torch.equal(o_static, o_eager) and torch.equal(lse_static, lse_eager)
        assert torch.isfinite(o_static).all()
