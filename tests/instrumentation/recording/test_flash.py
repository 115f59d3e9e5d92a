import json

import numpy as np
import pandas as pd
import pytest
import torch

from instrumentation import Trace, TraceFormatError, make_inputs, record
from kernels import SCHEDULES, reference_attention
from tests.kernels.attention_checks import ON_GPU
from tests.kernels.test_masks import mask_texts


def traced(n=150, d=32, mask="causal", bm=32, bn=32, b=1, h=2, schedule="natural", dtype="fp32",
           device="cpu", **kw):
    q, k, v = make_inputs(b, h, n, d, dtype, seed=n + d, device=device)
    out, trace = record(q, k, v, mask=mask, block_m=bm, block_n=bn, schedule=schedule, **kw)
    return (q, k, v), out, trace


@pytest.mark.parametrize("n", [17, 100])     # 1 and 4 query blocks of 32, the last partial
def test_trace_truth_every_mask(n, device):
    for text in mask_texts(n):
        (q, k, v), out, trace = traced(n=n, mask=text, device=device, trace_head=1)
        t = trace.tiles
        # the kernel visited exactly the tiles the mask does not skip
        assert (t.visited == (t.status != "skipped")).all(), text
        assert len(t) == trace.meta["n_q_blocks"] * trace.meta["n_k_blocks"]
        # one work row per (bh, q_block)
        w = trace.work
        assert len(w) == 2 * trace.meta["n_q_blocks"]
        assert not w.duplicated(["bh", "q_block"]).any()
        assert sorted(w.order) == list(range(len(w)))
        # visit order within a program is 0..k-1 for the visited tiles of each q block
        for qb, grp in t[t.visited].groupby("q_block"):
            assert sorted(grp.order) == list(range(len(grp)))
        # running max never decreases along a row; alpha in (0, 1]; final m, l equal float64
        r = trace.rows.sort_values(["q_row", "step"])
        assert (r.groupby("q_row").m.diff().dropna() >= -1e-6).all()
        _, m_ref, l_ref = reference_attention(q, k, v, mask=text)
        last = r.groupby("q_row").last()
        rows = last.index.to_numpy()
        assert len(rows) == n
        np.testing.assert_allclose(last.m, m_ref[0, 1, rows].numpy().copy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(last.l, l_ref[0, 1, rows].numpy(), rtol=1e-4)
        assert ((r.alpha >= 0) & (r.alpha <= 1 + 1e-6)).all()
        # the traced output rows are the kernel output
        o = trace.out.sort_values("q_row")
        np.testing.assert_allclose(o.filter(regex=r"^o\d+$").to_numpy(), out[0, 1, o.q_row.to_numpy()].float().cpu().numpy())


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_schedule_recorded(schedule, device, request):
    if device.type == "cpu":     # the run's causal problem under each schedule (B2 H2 N256, 32x32 blocks),
        # recorded once per run in the interpreter (tests/conftest.py: causal_schedules)
        trace = Trace.load(request.getfixturevalue("causal_schedules")[schedule])
    else:
        _, _, trace = traced(n=200, bm=32, mask="causal", schedule=schedule, device=device)
    assert trace.meta["schedule"] == schedule
    # the order work items were taken in: the interpreter counts it; on a GPU programs start
    # together (their start times tie and interleave), and program p runs the work list's entry p
    # (the persistent schedule's programs take items from a counter: its order is recorded)
    w = trace.work.sort_values("order" if device.type == "cpu" or schedule == "persistent" else "program")
    if schedule == "natural":
        assert list(w.bh * trace.meta["n_q_blocks"] + w.q_block) == list(range(len(w)))
    else:  # heads in order, the longest work of each head first
        assert w.bh.is_monotonic_increasing
        assert all(g.tiles_visited.is_monotonic_decreasing for _, g in w.groupby("bh"))


def test_selected_query_blocks_only(device):
    _, _, trace = traced(n=256, bm=32, trace_q_blocks=[1, 6], device=device)
    assert set(trace.rows.q_block) == {1, 6}
    assert trace.meta["traced_q_blocks"] == [1, 6]
    with pytest.raises(ValueError, match="outside"):
        traced(n=64, bm=32, trace_q_blocks=[5], device=device)


def test_work_level_has_no_tile_detail(device):
    _, _, trace = traced(level="work", device=device)
    assert len(trace.tiles) == 0 and len(trace.rows) == 0 and len(trace.work) > 0


def test_interpreter_trace_has_no_hardware_times():
    if torch.cuda.is_available():
        pytest.skip("interpreter property")
    _, _, trace = traced()
    assert trace.meta["backend"] == "interpreter"
    assert trace.work.t_start.isna().all() and (trace.work.sm == -1).all()
    assert "interpreter" in trace.provenance() and "modelled" in trace.provenance()


def test_save_load_round_trip_is_lossless(tmp_path, device):
    _, _, trace = traced(mask="document:50,70,30", device=device)
    trace.save(tmp_path / "t")
    back = Trace.load(tmp_path / "t")
    assert back.meta == {**json.loads(json.dumps(trace.meta)), "source": "recorded"}
    assert "recorded" in back.provenance() and "live" not in back.provenance()
    for name in ("work", "tiles", "rows", "out"):
        pd.testing.assert_frame_equal(getattr(back, name), getattr(trace, name), check_categorical=False)


def test_corrupt_and_foreign_files_are_refused(tmp_path, device):
    _, _, trace = traced(device=device)
    path = trace.save(tmp_path / "t")
    data = bytearray((path / "rows.parquet").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (path / "rows.parquet").write_bytes(bytes(data))
    with pytest.raises(TraceFormatError, match="corrupt"):
        Trace.load(path)
    with pytest.raises(TraceFormatError, match="no manifest"):
        Trace.load(tmp_path)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "manifest.json").write_text("{not json")
    with pytest.raises(TraceFormatError, match="not JSON"):
        Trace.load(tmp_path / "junk")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["schema_version"] = 0
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(TraceFormatError, match="schema version"):
        Trace.load(path)


def test_make_inputs_regenerates_one_head():
    q, k, v = make_inputs(2, 3, 40, 16, "fp16", seed=5)
    q1, k1, v1 = make_inputs(2, 3, 40, 16, "fp16", seed=5, heads_only=[4])
    assert torch.equal(q.reshape(6, 40, 16)[4], q1[0, 0]) and torch.equal(v.reshape(6, 40, 16)[4], v1[0, 0])
    assert q.std() > 0.5


@pytest.mark.skipif(ON_GPU, reason="its child records in Triton's CPU interpreter (--device cpu), which this "
                    "project runs with the newest Triton, not the GPU machines' 3.6")
def test_cli_end_to_end(tmp_path):
    # `python -m instrumentation.record_cli ...` in a child: run as __main__ with its argv (runpy, as
    # -m does), forked from the hostile harness's warm parent (torch and our packages imported)
    from tests.hostile.harness import run_snippet

    argv = ["-m", "--seq-len", "200", "--mask", "sliding_window:64", "--head-dim", "32", "--block-m", "32",
            "--block-n", "32", "--dtype", "fp16", "--heads", "2", "--device", "cpu", "--out", str(tmp_path / "cli")]
    res = run_snippet(f"import runpy, sys\nsys.argv = {argv!r}\n"
                      "runpy.run_module('instrumentation.record_cli', run_name='__main__', alter_sys=True)",
                      timeout=300)
    assert res.returncode == 0, res.stderr
    assert "skipped" in res.stdout and "wrote" in res.stdout
    trace = Trace.load(tmp_path / "cli")
    assert trace.meta["mask"] == "sliding_window:64" and trace.meta["shape"]["H"] == 2
    assert trace.meta["command"].startswith("python -m instrumentation.record_cli")
    # a bad mask: exit 2 with the reason, no traceback (its main() in this process: the child above
    # showed the command line reaches it; tests/instrumentation/cli/test_refusals.py.cli)
    from tests.instrumentation.cli.test_refusals import cli

    bad = cli("--seq-len", "100", "--mask", "document:10,20", "--device", "cpu", "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "sum to" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "bad").exists()


# -- on the GPU: hardware timing and SM ids --------------------------------------------------

@pytest.mark.gpu
def test_gpu_trace_has_sm_ids_and_times():
    (q, k, v), out, trace = traced(n=4096, d=128, bm=128, bn=128, b=2, h=8, dtype="bf16", device="cuda")
    w = trace.work
    assert trace.meta["backend"] == "cuda" and w.t_start.notna().all()
    assert (w.t_end > w.t_start).all() and (w.sm >= 0).all()
    assert w.sm.nunique() > 1
    # natural schedule: program p runs work item p; order is a permutation following t_start
    assert (w.program == w.bh * trace.meta["n_q_blocks"] + w.q_block).all()
    assert sorted(w.order) == list(range(len(w)))
    assert w.sort_values("order").t_start.is_monotonic_increasing
    t = trace.tiles[trace.tiles.visited]
    assert (t.cycles_end > t.cycles_start).all()
    assert trace.meta["untraced_ms"] > 0


def test_record_refuses_a_trace_over_its_budget_before_any_buffer(monkeypatch, device):
    """record() from Python checks the trace's own tables by arithmetic first, as record_cli does:
    every query block of N = 65536 traced with its softmax rows would decode to GBs."""
    import instrumentation.recording.flash as rec

    def no_plan(*args, **kwargs):
        raise AssertionError("a block plan was built before the size check")
    monkeypatch.setattr(rec, "block_plan", no_plan)
    q = torch.empty(1, 1, 65536, 16, dtype=torch.float16, device=device)
    with pytest.raises(ValueError, match="MiB") as info:
        record(q, q, q, mask="sliding_window:1", block_m=128, block_n=128, trace_q_blocks="all")
    assert "\n" not in str(info.value)
