"""kernels.device_cache: every cache that keeps device tensors across calls makes them through
the one helper (on CUDA a helper thread, so that a CUDA-graph warm-up's allocation routing, which
is per thread, never takes them into the graph's pool), and a plan the ops use while the stream
captures is held after the caches drop it. On the CPU the helper thread is forced (its CUDA
device and stream switch stubbed); the gpu tests with real graphs are in test_graph_pools.py."""

import contextlib
import gc
import threading
import weakref

import pytest
import torch

import kernels.device_cache as dc
from kernels.masks import parse_mask


@pytest.fixture
def helper_thread(monkeypatch):
    """Force the helper-thread path on the CPU; returns the list of (thread, value) each make gave."""
    made = []
    on_helper = dc._on_helper

    def recorded(make, index, stream):
        value = on_helper(make, index, stream)
        made.append((threading.current_thread(), value))
        return value

    monkeypatch.setattr(dc, "_helper_target", lambda device: None if getattr(dc._LOCAL, "helper", False) else (0, None))
    monkeypatch.setattr(dc, "_on_stream", lambda index, stream: contextlib.nullcontext())
    monkeypatch.setattr(dc, "_on_helper", recorded)
    return made


def _made_tensors(made) -> dict:
    out = {}
    for thread, value in made:
        assert thread is not threading.main_thread()
        for t in (value if isinstance(value, (list, tuple)) else [value]):
            out[id(t)] = t
    return out


def test_helper_runs_make_on_its_thread_raises_its_errors_and_nests_in_place(helper_thread):
    main = threading.get_ident()
    assert dc.persistent(threading.get_ident, "cuda") != main
    assert dc.persistent(lambda: dc.persistent(threading.get_ident, "cuda"), "cuda") != main   # nested: no deadlock
    with pytest.raises(ValueError, match="from make"):
        dc.persistent(lambda: (_ for _ in ()).throw(ValueError("from make")), "cuda")


def test_off_cuda_the_entry_is_made_in_place():
    assert dc._helper_target(torch.device("cpu")) is None and dc._helper_target("cpu") is None
    assert dc.persistent(threading.get_ident, "cpu") == threading.get_ident()
    assert not dc.capturing("cpu")


def test_every_cache_makes_its_device_tensors_through_the_helper(helper_thread, monkeypatch):
    import kernels.backward_plan as bplan
    import kernels.decode_launch as dl
    import kernels.fp8_quant as fq
    import kernels.naive as naive
    import kernels.plan as plan

    spec = parse_mask("sliding_window:5")
    monkeypatch.setattr(plan, "_PLANS", plan.BoundedCache(8, 1 << 20, 1 << 20, plan.plan_bytes))
    monkeypatch.setattr(bplan, "_BACKWARD_PLANS", bplan.BoundedCache(8, 1 << 20, 1 << 20, lambda bp: bp.nbytes))
    monkeypatch.setattr(dl, "_COUNTERS", {})
    for cached in (dl._full_lengths, fq._had_on, naive._hidden):
        cached.cache_clear()
    bp = plan.block_plan(spec, 40, 16, 16, "cpu", 48)
    works = bp.work_list(3, "longest_first")
    back = bplan.backward_plan(spec, 40, 48, bplan.INTERPRETER_CONFIG, "cpu")
    device_tensors = [bp.row_lo, bp.row_hi, bp.full_cnt, bp.full_start, bp.part_cnt, bp.part_idx, works,
                      back.kv_full_cnt, back.kv_full_start, back.kv_part_cnt, back.kv_part_idx, back.kv_part_before,
                      back.kv_order, back.q_order, back.q_plan.row_lo,
                      dl._full_lengths(3, 40, "cpu"), dl.merge_counters(torch.device("cpu"), 2000),
                      fq._had_on(64, torch.float32, "cpu"), fq._had_on(64, torch.float16, "cpu", True),
                      naive._hidden(spec, 12, 20, "cpu")[0]]
    made = _made_tensors(helper_thread)
    assert [i for i, t in enumerate(device_tensors) if id(t) not in made] == []
    # the lists are the plan's: the same values as made in place
    lo, hi = spec.row_intervals(40, 48)
    assert torch.equal(bp.row_lo, torch.from_numpy(lo)) and torch.equal(bp.row_hi, torch.from_numpy(hi))
    assert dl.merge_counters(torch.device("cpu"), 2000).numel() == 2000 and not dl._COUNTERS[next(iter(dl._COUNTERS))].any()


def test_plans_the_ops_use_while_capturing_are_held_after_the_caches_drop_them(monkeypatch):
    import kernels.plan as plan
    from kernels.backward_launch import _PLANNED, backward_impl
    from kernels.backward_plan import _BACKWARD_PLANS, INTERPRETER_CONFIG, backward_plan
    from kernels.flash_ops import flash_attention_op
    from kernels.launch import clear_caches, resolve_launch

    g = torch.Generator().manual_seed(4)
    q, k, v, do = (torch.randn(1, 2, 20, 16, generator=g) for _ in range(4))
    mask = "sliding_window:7"
    monkeypatch.setattr(dc, "_HELD", {})
    o, lse = flash_attention_op(q, k, v, mask, None, None, None, "natural", None, None, None, True, None)
    assert dc._HELD == {}                                   # not capturing: nothing held
    monkeypatch.setattr(dc, "capturing", lambda device: True)
    flash_attention_op(q, k, v, mask, None, None, None, "natural", None, None, None, True, None)
    monkeypatch.setattr("kernels.backward_launch._launch", lambda *args, **kwargs: None)   # its host path alone
    backward_impl(do, q, k, v, o, lse, mask)
    lp = resolve_launch(q, k, v, mask, None, None, "natural", None, None, True, None, None, None, None, False, False,
                        "all")
    bp = backward_plan(parse_mask(mask, 20, 20), 20, 20, INTERPRETER_CONFIG, q.device)
    assert {id(lp), id(bp)} <= set(dc._HELD)
    lists = weakref.ref(lp.block.row_lo), weakref.ref(bp.kv_order)
    del lp, bp
    clear_caches()
    plan._PLANS.clear()
    _BACKWARD_PLANS.clear()
    _PLANNED.clear()                                        # the untraced calls' launch plans hold them too
    gc.collect()
    assert all(ref() is not None for ref in lists)          # a graph may still read them
    dc._HELD.clear()
    gc.collect()
    assert all(ref() is None for ref in lists)              # (held only by _HELD)


def test_a_cuda_streams_grown_or_dropped_counter_buffer_is_retired_not_freed(monkeypatch):
    """CUDA-graph trees capture on the stream they warmed up on, with that stream's buffer: when it
    grows (a larger step) or is dropped (too many streams) a graph may still read the old one."""
    import kernels.decode_launch as dl

    monkeypatch.setattr(dl, "_zeros", lambda size, device: torch.zeros(size, dtype=torch.int32))
    monkeypatch.setattr(dl, "_COUNTERS", {})
    monkeypatch.setattr(dl, "_RETIRED_GRAPH_COUNTERS", [])
    monkeypatch.setattr(dl, "_MAX_COUNTER_BUFFERS", 3)
    cuda = torch.device("cuda")
    first = dl._fresh(("cuda", 0, 7), 1024, cuda)
    assert dl._fresh(("cuda", 0, 7), 1000, cuda) is first and dl._RETIRED_GRAPH_COUNTERS == []
    grown = dl._fresh(("cuda", 0, 7), 4096, cuda)
    assert grown.numel() == 4096 and [id(t) for t in dl._RETIRED_GRAPH_COUNTERS] == [id(first)]
    for stream in (8, 9, 10):                           # the oldest stream's buffer is dropped
        dl._fresh(("cuda", 0, stream), 1024, cuda)
    assert ("cuda", 0, 7) not in dl._COUNTERS and dl._RETIRED_GRAPH_COUNTERS[-1] is grown
    dl._fresh(("cpu", 1), 1024, torch.device("cpu"))    # the interpreter's per-thread buffers: freed
    dl._fresh(("cpu", 1), 2048, torch.device("cpu"))
    assert len(dl._RETIRED_GRAPH_COUNTERS) == 2
