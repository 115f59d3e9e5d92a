"""Trace schema 2 (real shapes): N_q, N_k, H_kv in meta, each work item's kv_head; version-1
traces still load (a bundled one), several traced heads per recording."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from instrumentation import record
from instrumentation.trace import SCHEMA_VERSION, Trace, TraceFormatError

LEGACY = Path(__file__).resolve().parents[3] / "data" / "traces" / "legacy-v1" / "n1024_causal_natural"


def test_bundled_version_1_trace_still_loads():
    assert json.loads((LEGACY / "manifest.json").read_text())["schema_version"] == 1
    t = Trace.load(LEGACY)
    s = t.meta["shape"]
    assert SCHEMA_VERSION == 2 and t.meta["schema_version"] == 2
    assert s["N_q"] == s["N_k"] == s["N"] == t.seq_len == t.kv_len and s["H_kv"] == s["H"] == t.kv_heads
    assert (t.work["kv_head"] == t.work["head"]).all() and len(t.work) == s["B"] * s["H"] * t.meta["n_q_blocks"]


def test_gqa_rectangular_trace_records_kv_heads_and_two_heads(tmp_path, device):
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 40, 24, generator=g).to(device)               # (B, H, N_q, D)
    k, v = (torch.randn(1, 2, 100, 24, generator=g).to(device) for _ in range(2))   # (B, H_kv, N_k, D)
    out, tr = record(q, k, v, mask="causal", block_m=16, block_n=32, trace_head=[0, 3], trace_q_blocks="all")
    s = tr.meta["shape"]
    assert (s["N_q"], s["N_k"], s["H"], s["H_kv"]) == (40, 100, 4, 2)
    assert (tr.meta["n_q_blocks"], tr.meta["n_k_blocks"]) == (3, 4) and tr.meta["traced_heads"] == [0, 3]
    np.testing.assert_array_equal(tr.work["kv_head"], tr.work["head"] // 2)
    assert set(tr.tiles["bh"]) == {0, 3} and len(tr.tiles) == 2 * 3 * 4
    for bh in (0, 3):
        tiles = tr.tiles[tr.tiles.bh == bh]
        assert (tiles.visited == (tiles.status != "skipped")).all()
        rows = tr.rows[tr.rows.bh == bh]
        last = rows.sort_values("step").groupby("q_row").last()
        # the final running state is the row's log-sum-exp (natural units, scale 1/sqrt(D))
        from kernels import reference_attention
        from kernels.reference import reference_lse
        _, m, l = reference_attention(q, k, v, mask="causal")
        lse = reference_lse(m, l)[0, bh].numpy()
        got = last["m"] + np.log(last["l"])
        np.testing.assert_allclose(got.to_numpy(), lse[last.index.to_numpy()], rtol=1e-4, atol=1e-4)
        assert len(tr.out[tr.out.bh == bh]) == 40
    again = Trace.load(tr.save(tmp_path / "gqa"))
    assert again.meta["shape"] == s and (again.work["kv_head"] == tr.work["kv_head"]).all()


def test_meta_that_contradicts_n_k_is_refused(tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(LEGACY, bad)
    doc = json.loads((bad / "manifest.json").read_text())
    doc["schema_version"] = 2
    doc["meta"]["shape"].update(N_q=1024, N_k=4096, H_kv=doc["meta"]["shape"]["H"])
    (bad / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError, match="N_k=4096"):
        Trace.load(bad)


def test_record_cli_takes_kv_len_and_kv_heads(tmp_path):
    from tests.instrumentation.cli.test_refusals import cli      # the command's main(), in process

    out = tmp_path / "t"
    res = cli("--seq-len", "40", "--kv-len", "100", "--heads", "4", "--kv-heads", "2", "--head-dim", "24",
              "--block-m", "16", "--block-n", "32", "--device", "cpu", "--out", str(out))
    assert res.returncode == 0, res.stderr
    t = Trace.load(out)
    assert (t.meta["shape"]["N_k"], t.meta["shape"]["H_kv"]) == (100, 2) and t.kv_len == 100
    res = cli("--seq-len", "40", "--heads", "4", "--kv-heads", "3", "--device", "cpu", "--out", str(tmp_path / "u"))
    assert res.returncode == 2 and "multiple of --kv-heads 3" in res.stderr and "Traceback" not in res.stderr


def test_bundled_preset_traces_replay_the_online_softmax_and_draw_rectangular_block_maps():
    """GQA and chunked-prefill recordings: the kernel's per-row state matches float64 from the
    regenerated inputs (query head -> its KV head, N_k keys), for every traced head."""
    from instrumentation.analysis.block_stats import blockmap_stats
    from instrumentation.analysis.online_softmax import default_q_row, softmax_steps
    from instrumentation.recording.inputs import inputs_for_trace
    from instrumentation.recording.data_bundle import detailed_heads
    root = LEGACY.parents[1]
    for name in ("preset-chunked-prefill_n512_nk8192_causal_natural", "preset-llama-3-8b_n4096_causal_natural"):
        if not (root / name).exists():
            pytest.skip(f"{name} is not bundled")
        t = Trace.load(root / name)
        n_bh = t.meta["shape"]["B"] * t.meta["shape"]["H"]
        assert t.meta["traced_heads"] == detailed_heads(n_bh)
        for bh in t.meta["traced_heads"]:
            q, k, v = inputs_for_trace(t, bh)
            assert k.shape[2] == t.kv_len
            steps = softmax_steps(t, default_q_row(t, bh), q, k, v, bh=bh)
            assert steps.attrs["inputs_match"] and steps.attrs["kernel_out_rel_err"] < 2e-2
            m = t.meta
            st = blockmap_stats(m["mask"], t.seq_len, m["block_m"], m["block_n"], m["shape"]["D"], t, bh, t.kv_len)
            assert st["disagreements"] == 0 and st["grid"] == (m["n_q_blocks"], m["n_k_blocks"])


def test_mask_spec_is_parsed_once_per_mask_text():
    t = Trace.load(LEGACY)
    spec = t.mask_spec
    assert spec is t.mask_spec and spec.text == "causal"
    t.meta["mask"] = "full"                  # a new text is parsed again, the old spec is not reused
    assert t.mask_spec.text == "full" and t.mask_spec is not spec
    t.meta["mask"] = "document:1,2"          # checked against N_q / N_k, as at a file edge
    with pytest.raises(ValueError, match="sum to"):
        t.mask_spec
