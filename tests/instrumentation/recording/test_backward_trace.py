"""record(..., backward=True): the backward's tables against the mask's block lists (every visible
tile once per phase, dK/dV programs in increasing query-block order, GQA heads one after another
in a dK/dV program), the recomputed P's row sums against the forward's lse, gradients equal to
the untraced backward's, save / load, refusals; on a GPU, real clocks at a realistic shape."""

import numpy as np
import pytest
import torch

from instrumentation import record
from instrumentation.recording.backward import grad_output
from instrumentation.trace import Trace
from instrumentation.trace.schema import TraceFormatError
from kernels import flash_attention, reference_attention, reference_lse
from kernels.backward import BackwardConfig, backward_trace_buffers, flash_attention_backward
from kernels.masks import FULL, PARTIAL, parse_mask
from tests.kernels.test_masks import mask_texts


def inputs(b, h, h_kv, n_q, n_k, d, seed=0, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n_q, d, generator=g)
    k, v = (torch.randn(b, h_kv, n_k, d, generator=g) for _ in range(2))
    return [t.to(device=device, dtype=dtype) for t in (q, k, v)]


def check_tables(trace, q, k, v, mask, heads):
    """The invariants of bwd_work, bwd_tiles and bwd_rows for a recording of q, k under mask."""
    b, h, n_q, _ = q.shape
    h_kv, n_k = k.shape[1], k.shape[2]
    group = h // h_kv
    spec = parse_mask(mask, n_q, n_k)
    bwd = trace.meta["backward"]
    work, tiles, rows = trace.bwd_work, trace.bwd_tiles, trace.bwd_rows
    # one work row per program of each phase, the order a permutation of them all (the one-pass
    # Gluon kernel has no dQ programs: its dK/dV programs add dQ)
    one_pass = bool(bwd.get("one_pass"))
    assert one_pass == (bwd["implementation"] == "gluon one pass") and bwd["programs"]["dq"] == (0 if one_pass else
                                                                                                 len(work[work.phase == "dq"]))
    assert sorted(work["order"]) == list(range(len(work)))
    expect = {"delta": (b, h, bwd["delta"]["n_q_blocks"]), "dkdv": (b, h_kv, bwd["dkdv"]["n_k_blocks"]),
              "dq": (b, h, 0 if one_pass else bwd["dq"]["n_q_blocks"])}
    maps = {p: spec.block_map(n_q, bwd[p]["block_m"], bwd[p]["block_n"], n_k) for p in ("dkdv", "dq")}
    for phase, (nb, nh, nblk) in expect.items():
        w = work[work.phase == phase]
        got = sorted(zip(w.b, w["head"], w.block))
        assert got == [(x, y, z) for x in range(nb) for y in range(nh) for z in range(nblk)], phase
        assert w.empty or sorted(w.program) == list(range(w.program.min(), w.program.min() + len(w)))
    dkdv_w, dq_w = work[work.phase == "dkdv"], work[work.phase == "dq"]
    assert (dkdv_w.tiles.to_numpy() == group * (maps["dkdv"] != 0).sum(axis=0)[dkdv_w.block]).all()
    assert (dq_w.tiles.to_numpy() == (maps["dq"] != 0).sum(axis=1)[dq_w.block]).all()
    for bh in heads:
        bb, hh = divmod(bh, h)
        for phase in ("dkdv", "dq"):
            t = tiles[(tiles.phase == phase) & (tiles.b == bb) & (tiles["head"] == hh)]
            visible = sorted(zip(*np.nonzero(maps[phase]))) if phase == "dkdv" or not one_pass else []
            assert sorted(zip(t.q_block, t.k_block)) == visible, (mask, phase, bh)   # each once
            assert (t.kv_head == hh // group).all()
        # a dK/dV program: its key block's query blocks in increasing order (the Gluon passes: the
        # full run, then the partial ones), after the tiles of the group's earlier heads
        t = tiles[(tiles.phase == "dkdv") & (tiles.b == bb) & (tiles["head"] == hh)]
        for kb, col in t.groupby("k_block"):
            col = col.sort_values("order")
            if bwd["implementation"].startswith("gluon"):
                column = maps["dkdv"][:, kb]
                assert list(col.q_block) == list(np.nonzero(column == FULL)[0]) + list(np.nonzero(column == PARTIAL)[0])
            assert col.q_block.is_unique and (col.q_block.is_monotonic_increasing or
                                              bwd["implementation"].startswith("gluon"))
            first = (hh % group) * (maps["dkdv"][:, kb] != 0).sum()
            assert list(col.order) == list(range(first, first + len(col))), (mask, kb)
            w = dkdv_w[(dkdv_w.b == bb) & (dkdv_w["head"] == hh // group) & (dkdv_w.block == kb)]
            assert set(col.program) == set(w.program)
        t = tiles[(tiles.phase == "dq") & (tiles.b == bb) & (tiles["head"] == hh)]
        for qb, row in t.groupby("q_block"):
            assert sorted(row.order) == list(range(len(row)))
            w = dq_w[(dq_w.b == bb) & (dq_w["head"] == hh) & (dq_w.block == qb)]
            assert set(row.program) == set(w.program)
    # the recomputed P sums to 1 on every row that sees a key, against the forward's lse (the
    # float64 reference's); a row that sees none has no lse and sums to 0
    tol = 1e-4 if q.dtype == torch.float32 else 3e-3
    assert sorted(set(rows.b * h + rows["head"])) == sorted(heads)
    for bh in heads:
        bb, hh = divmod(bh, h)
        r = rows[(rows.b == bb) & (rows["head"] == hh)]
        kv = slice(hh // group, hh // group + 1)
        _, m, l = reference_attention(q[bb:bb + 1, hh:hh + 1], k[bb:bb + 1, kv], v[bb:bb + 1, kv], mask)
        ref = reference_lse(m, l)[0, 0].numpy()[r.q_row]
        seen = r.lse.notna().to_numpy()
        assert np.array_equal(seen, np.isfinite(ref)) and seen.any(), (mask, bh)
        assert np.allclose(r.lse[seen], ref[seen], rtol=tol, atol=tol), (mask, bh)
        assert np.allclose(r.p_rowsum[seen], 1.0, atol=tol) and (r.p_rowsum[~seen] == 0).all(), (mask, bh)


def test_tables_for_every_mask_with_gqa_and_unequal_lengths():
    # GQA 2/1, N_q 40 against N_k 72: each dK/dV program sums two query heads; both traced
    q, k, v = inputs(1, 2, 1, 40, 72, 8)
    for mask in mask_texts(72):
        _, trace = record(q, k, v, mask=mask, block_m=32, block_n=32, trace_head=[0, 1], backward=True)
        check_tables(trace, q, k, v, mask, [0, 1])
        assert trace.meta["backward"]["clock"].startswith("none") and trace.bwd_work.t_start.isna().all()


def test_window_below_the_full_run_and_gradients_equal_the_untraced_backward():
    # a window of 80 keys in 32 x 32 tiles: key block 0 has a partial query block above its full
    # run (the diagonal) and two below it (the window's far edge), visited last
    q, k, v = inputs(1, 2, 2, 128, 128, 8, seed=1)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(5))
    mask = "sliding_window:80"
    o, trace = record(*leaves, mask=mask, block_m=32, block_n=32, trace_head=[1], backward=True, grad_out=do)
    check_tables(trace, q, k, v, mask, [1])
    col = trace.bwd_tiles.query("phase == 'dkdv' and k_block == 0").sort_values("order")
    assert list(col.q_block) == [0, 1, 2, 3] and list(col.status) == ["partial", "full", "partial", "partial"]
    o_ref, lse = flash_attention(q, k, v, mask, block_m=32, block_n=32, return_lse=True)
    grads = flash_attention_backward(do, q, k, v, o_ref, lse, mask)
    assert torch.equal(o, o_ref) and not o.requires_grad
    for leaf, g in zip(leaves, grads):
        assert torch.equal(leaf.grad, g)
    assert trace.meta["backward"]["grad_out"] == "given by the caller"
    # the default dO is the seeded one the meta names; .grad accumulates as autograd's does
    _, again = record(*leaves, mask=mask, block_m=32, block_n=32, trace_head=[1], backward=True)
    do0, text = grad_output(o)
    assert "manual_seed(0)" in again.meta["backward"]["grad_out"] and text == again.meta["backward"]["grad_out"]
    for leaf, g, g0 in zip(leaves, grads, flash_attention_backward(do0, q, k, v, o_ref, lse, mask)):
        assert torch.equal(leaf.grad, g + g0)


def test_save_load_round_trip_and_damaged_tables(tmp_path):
    q, k, v = inputs(1, 2, 1, 70, 33, 8, seed=2)        # grids of 3 x 2 blocks in both phases
    _, trace = record(q, k, v, mask="causal", block_m=16, block_n=16, trace_head=[0, 1], backward=True)
    back = Trace.load(trace.save(tmp_path / "t"))
    for name in ("bwd_work", "bwd_tiles", "bwd_rows"):
        assert back.tables[name].reset_index(drop=True).equals(trace.tables[name].reset_index(drop=True)), name
    assert back.meta["backward"] == {**trace.meta["backward"], "untraced_ms": None, "traced_ms": None}
    # a forward-only trace has none of the tables and still loads
    _, fwd = record(q, k, v, mask="causal", block_m=16, block_n=16)
    assert "bwd_work" not in Trace.load(fwd.save(tmp_path / "f")).tables
    damaged = [("bwd_tiles", "phase", "sideways", "phase 'sideways' is not one of"),
               ("bwd_tiles", "k_block", 2, "a dkdv k_block lies outside 0..1"),
               ("bwd_work", "phase", "dq", "two rows for the same"),
               ("bwd_tiles", "status", "<b>x</b>", "status is not one of")]
    for i, (name, col, value, message) in enumerate(damaged):
        tables = {n: df.copy() for n, df in trace.tables.items()}
        tables[name].loc[0, col] = value
        path = Trace(meta=trace.meta, tables=tables).save(tmp_path / f"d{i}")
        with pytest.raises(TraceFormatError, match=message) as err:
            Trace.load(path)
        assert "\n" not in str(err.value)
    meta = {**trace.meta, "backward": {**trace.meta["backward"], "dq": {**trace.meta["backward"]["dq"], "n_q_blocks": 9}}}
    with pytest.raises(TraceFormatError, match="backward dq blocks of 32 x 32 tile N_q=70, N_k=33 as 3 x 2, not 9 x 2"):
        Trace.load(Trace(meta=meta, tables=trace.tables).save(tmp_path / "m"))


def test_bad_input_is_refused_in_one_line():
    q, k, v = inputs(1, 1, 1, 16, 16, 8)
    cases = [(dict(backward="yes"), "backward must be True or False"),
             (dict(grad_out=torch.zeros(1, 1, 16, 8)), "pass backward=True"),
             (dict(backward=True, grad_out=torch.zeros(1, 1, 15, 8)), "shaped like the output"),
             (dict(backward=True, grad_out=torch.full((1, 1, 16, 8), float("nan"))), "finite")]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            record(q, k, v, mask="causal", **kwargs)
        assert "\n" not in str(err.value)


@pytest.mark.gpu
def test_gpu_clocks_at_a_realistic_shape(device):
    # B1 H16 D128 N4096 causal fp16 (the bundled recording's shape), GQA off
    q, k, v = inputs(1, 16, 16, 4096, 4096, 128, seed=3, dtype=torch.float16, device=device)
    _, trace = record(q, k, v, mask="causal", trace_head=[0, 15], backward=True)
    check_tables(trace, q, k, v, "causal", [0, 15])
    work = trace.bwd_work
    assert (work.t_start < work.t_end).all() and work.t_start.min() == 0
    assert work.sm.between(0, trace.meta["sm_count"] - 1).all()
    assert trace.meta["backward"]["untraced_ms"] > 0 and trace.meta["backward"]["traced_ms"] > 0
    # the phases run in launch order: every delta program ends before the passes begin
    delta = work[work.phase == "delta"]
    assert delta.t_end.max() <= work[work.phase != "delta"].t_start.min()


def test_record_cli_writes_the_backward_tables(tmp_path, capsys):
    from instrumentation.cli.flash import main

    args = ["--seq-len", "48", "--head-dim", "8", "--heads", "2", "--kv-heads", "1", "--dtype", "fp32",
            "--block-m", "16", "--block-n", "16", "--trace-head", "1", "--out", str(tmp_path / "t")]
    assert main(args + ["--backward"]) == 0
    assert "backward: 2 delta + 2 dK/dV + 4 dQ programs" in capsys.readouterr().out
    trace = Trace.load(tmp_path / "t")
    assert sorted(trace.bwd_work.phase.unique()) == ["delta", "dkdv", "dq"] and len(trace.bwd_work) == 8
    assert set(trace.bwd_tiles["head"]) == {1} and np.allclose(trace.bwd_rows.p_rowsum[trace.bwd_rows.lse.notna()], 1)
    assert main(args[:-1] + [str(tmp_path / "u")]) == 0 and "bwd_work" not in Trace.load(tmp_path / "u").tables


def test_two_launches_record_every_program_and_foreign_buffers_are_refused():
    q, k, v = inputs(1, 2, 1, 50, 40, 8, seed=4)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(6))
    mask = "sliding_window:20"
    o, lse = flash_attention(q, k, v, mask, return_lse=True)
    seen = []
    for one_launch in (True, False):
        cfg = BackwardConfig(16, 16, 16, 16, 4, 1, one_launch=one_launch)
        tr = backward_trace_buffers(q, k, mask, [1], config=cfg)
        grads = flash_attention_backward(do, q, k, v, o, lse, mask, trace=tr)
        assert sorted(tr.work[:, 0].tolist()) == list(range(len(tr.work)))   # every program wrote its record
        seen.append((grads, tr.tiles_dkdv.clone(), tr.tiles_dq.clone(), tr.rows.clone()))
    for a, b in zip(*seen):
        for x, y in zip(a if isinstance(a, tuple) else [a], b if isinstance(b, tuple) else [b]):
            assert torch.equal(x.nan_to_num(-9), y.nan_to_num(-9))
    other = backward_trace_buffers(q, k, "causal", [1], config=BackwardConfig(32, 32, 32, 32, 4, 1))
    with pytest.raises(ValueError, match="with backward_trace_buffers for this call") as err:
        flash_attention_backward(do, q, k, v, o, lse, mask, trace=other, config=cfg)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("hw", [True, False])
def test_unwritten_dq_records_are_left_out_as_a_one_pass_leaves_them(hw):
    """The one-pass Gluon backward writes no dQ programs' records: bwd_work keeps the preprocess's and
    the dK/dV programs' rows, the clock counting from the earliest written start and the order a
    permutation of the kept programs (on the CPU: the buffers of a real call, the dQ records erased)."""
    from instrumentation.recording.raw_trace import _decode_bwd_work

    q, k, v = inputs(1, 2, 1, 64, 48, 8, seed=5)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(7))
    o, lse = flash_attention(q, k, v, "causal", return_lse=True)
    tr = backward_trace_buffers(q, k, "causal", [0])
    flash_attention_backward(do, q, k, v, o, lse, "causal", trace=tr)
    if hw:      # a GPU's records: (order -1, sm, t_start, t_end), times from a clock
        n = len(tr.work)
        tr.work[:, 0] = -1
        tr.work[:, 1] = torch.arange(n) % 3
        tr.work[:, 2] = 1000 + 10 * torch.arange(n)
        tr.work[:, 3] = tr.work[:, 2] + 5
    tr.work[tr.n_delta + tr.n_dkdv:] = -1
    work = _decode_bwd_work(tr, 1, 2, 1, hw)
    assert sorted(set(work.phase)) == ["delta", "dkdv"] and len(work) == tr.n_delta + tr.n_dkdv
    assert sorted(work.order) == list(range(len(work)))
    if hw:
        assert work.t_start.min() == 0 and work.t_end.max() == 10 * (len(work) - 1) + 5


def test_flash_attn_func_deterministic_reaches_the_backward(monkeypatch):
    """flash_attn_func(deterministic=True) runs its backward with BackwardConfig.deterministic (the
    two passes where the one-pass Gluon kernel would run); without it the backward takes its default."""
    import kernels.flash_ops as flash_ops
    from kernels.flash_attn_interface import flash_attn_func

    seen = []
    real = flash_ops.backward_impl

    def spy(*args, **kw):
        seen.append(args[9] if len(args) > 9 else kw.get("config"))
        return real(*args, **kw)
    monkeypatch.setattr(flash_ops, "backward_impl", spy)
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 24, 2, 16, generator=g).requires_grad_() for _ in range(3))
    grads = []
    for deterministic in (True, False):
        out = flash_attn_func(q, k, v, causal=True, deterministic=deterministic)
        grads.append(torch.autograd.grad(out, (q, k, v), torch.ones_like(out)))
    assert seen[0] is not None and seen[0].deterministic and (seen[1] is None or not seen[1].deterministic)
    assert all(torch.equal(a, b) for a, b in zip(*grads))       # the interpreter: the same passes either way
